// The lab's figure view: draws a plotly figure and keeps the plot, so that a new figure under
// the same key is redrawn in place by one Plotly.react call. Streamlit calls this function when
// the view mounts and again whenever its data (the figure) changes; cleanup runs on unmount.
// plotly.js is the installed plotly package's own copy, served from the app's ./static folder
// (ui/figure_view.py puts it there).

const PLOTLY_PATH = "app/static/plotly.min.js";

function appBase() {
  // Streamlit's own bundle sits at <base>static/js/index.*.js; the app's static files at
  // <base>app/static/, whatever page the browser is on and whatever base URL the server has.
  const bundle = document.querySelector('script[src*="/static/js/index."]');
  return bundle ? bundle.src.replace(/static\/js\/[^/]*$/, "") : `${window.location.origin}/`;
}

function loadPlotly() {
  // One script tag for the whole page, shared by every view.
  if (!window.__labPlotly) {
    window.__labPlotly = window.Plotly
      ? Promise.resolve(window.Plotly)
      : new Promise((resolve, reject) => {
          const tag = document.createElement("script");
          tag.src = appBase() + PLOTLY_PATH;
          tag.onload = () => resolve(window.Plotly);
          tag.onerror = () => {
            window.__labPlotly = null; // the next figure tries again
            reject(new Error(`plotly.js did not load from ${tag.src}`));
          };
          document.head.appendChild(tag);
        });
  }
  return window.__labPlotly;
}

// -- fitting a figure to a narrow view (a phone) -------------------------------------------
// A figure is built for a laptop's column; on a phone its titles would run past the edge (plotly
// never wraps them) and a grid's labels into each other. Titles are wrapped at spaces to the
// plot's width, and the labels of a text trace shrink until its widest row fits (at least 7 px).
const CHAR_EM = 0.52; // a character's average width, in ems, in the lab's sans-serif font
const MIN_LABEL_PX = 7;
const LINE_EM = 1.3; // a title line's height, in ems (plotly.js spaces lines so)
const TITLE_TOP_PX = 8; // a wrapped title's first line, from the figure's top
const fittedTraces = new WeakMap(); // trace -> {width, trace}: a redraw keeps the same objects

function plain(text) {
  return text.replace(/<[^>]*>/g, "");
}

function wrap(text, maxChars) {
  // Each <br>-separated line wrapped at spaces; lines with markup other than <b>/<i> are kept.
  return text.split("<br>").map((line) => {
    if (plain(line).length <= maxChars || /<(?!\/?[bi]>)/.test(line)) return line;
    const out = [];
    let current = "";
    for (const word of line.split(" ")) {
      const next = current ? `${current} ${word}` : word;
      if (current && plain(next).length > maxChars) {
        out.push(current);
        current = word;
      } else {
        current = next;
      }
    }
    out.push(current);
    return out.join("<br>");
  }).join("<br>");
}

function wrapTitle(owner, key, px, fontPx) {
  const title = owner?.[key];
  const text = typeof title === "string" ? title : title?.text;
  if (!text) return 0;
  const wrapped = wrap(text, Math.max(8, Math.floor(px / (fontPx * CHAR_EM))));
  if (wrapped === text) return 0;
  owner[key] = typeof title === "string" ? wrapped : { ...title, text: wrapped };
  return wrapped.split("<br>").length - text.split("<br>").length; // lines added
}

function fitLabels(trace, plotPx) {
  const size = trace.textfont?.size;
  if (trace.type !== "scatter" || !String(trace.mode).includes("text") || !size ||
      !Array.isArray(trace.text) || !Array.isArray(trace.x)) return trace;
  const kept = fittedTraces.get(trace);
  if (kept && kept.width === plotPx) return kept.trace;
  const columns = new Set(trace.x.map((x) => Math.round(x * 4))).size;
  const chars = Math.max(1, ...trace.text.map((t) => Math.max(...plain(String(t).replace(
    /<br>/g, "\n")).split("\n").map((line) => line.length))));
  const needed = columns * (chars * size * CHAR_EM + 4);
  const fitted = needed <= plotPx ? trace : {
    ...trace, textfont: { ...trace.textfont, size: Math.max(MIN_LABEL_PX, size * plotPx / needed) },
  };
  fittedTraces.set(trace, { width: plotPx, trace: fitted });
  return fitted;
}

function fit(figure, width) {
  const { layout } = figure;
  const margin = layout.margin ?? {};
  const plotPx = width - (margin.l ?? 80) - (margin.r ?? 80);
  const fitted = { ...layout };
  const fontPx = layout.font?.size ?? 12;
  const titlePx = layout.title?.font?.size ?? fontPx * 1.45; // plotly's title, a size up
  const added = wrapTitle(fitted, "title", width - 20, titlePx);
  const above = added * titlePx * LINE_EM;
  let below = 0;
  for (const axis of Object.keys(layout).filter((k) => /^xaxis\d*$/.test(k))) {
    fitted[axis] = { ...layout[axis] };
    below = Math.max(below, wrapTitle(fitted[axis], "title", plotPx, fontPx) * fontPx * 1.2);
  }
  if ((above || below) && layout.height) { // room for the added lines, the plot keeps its size
    fitted.height = layout.height + above + below;
    fitted.margin = { ...margin, t: (margin.t ?? 100) + above, b: (margin.b ?? 80) + below };
  }
  if (above && layout.height) {
    // plotly.js centres a title of several lines on its y whatever its anchor says: put that
    // centre where the lines hang from the top into the margin grown for them.
    const title = typeof fitted.title === "string" ? { text: fitted.title } : fitted.title;
    const lines = title.text.split("<br>").length;
    const centre = TITLE_TOP_PX + (lines * titlePx * LINE_EM) / 2;
    fitted.title = { ...title, yref: "container", y: 1 - centre / fitted.height,
                     yanchor: "middle" };
  }
  return { ...figure, layout: fitted, traces: figure.traces.map((t) => fitLabels(t, plotPx)) };
}

function followWidth(view, Plotly) {
  // Plotly sizes an autosized plot once, when it draws; redraw it, fitted again, when its column
  // changes width (window resized, sidebar opened or closed).
  if (view.labObserver) return;
  let width = view.clientWidth;
  view.labObserver = new ResizeObserver(() => {
    if (view.clientWidth !== width && view.clientWidth > 0) {
      width = view.clientWidth;
      const next = fit(view.labDrawn, width); // react keeps the old size: resize after it
      Plotly.react(view, next.traces, next.layout, next.config)
        .then(() => Plotly.Plots.resize(view));
    }
  });
  view.labObserver.observe(view);
}

// -- bringing what a step changed into view ---------------------------------------------------
// The step controls stick under the header (assets/lab.css). After a Step, the step's first part
// (its question and caption; in classroom mode the figure) is scrolled in right under them, and
// then the figure whole if it did not fit, never its top under the controls.
const GAP_PX = 8;
const CONTROLS = '[data-testid="stLayoutWrapper"]:has(> [class*="step_controls"])';

function reveal(view) {
  const controls = document.querySelector(CONTROLS);
  const pane = view.closest('[data-testid="stMain"]');
  if (!controls || !pane) {
    view.scrollIntoView({ block: "nearest" });
    return;
  }
  // Where the controls' bottom is once stuck, wherever the pane is scrolled now.
  const top = (parseFloat(getComputedStyle(controls).top) || 0) + controls.offsetHeight + GAP_PX;
  const bottom = window.innerHeight;
  let first = controls.nextElementSibling;
  while (first && first.getBoundingClientRect().height === 0) first = first.nextElementSibling;
  const box = view.getBoundingClientRect();
  const start = Math.min(first ? first.getBoundingClientRect().top : box.top, box.top);
  if (start >= top - 1 && box.bottom <= bottom + 1) return; // all in view already
  pane.scrollBy({ top: start - top });
  const moved = view.getBoundingClientRect();
  if (moved.bottom > bottom) {
    pane.scrollBy({ top: Math.min(moved.bottom - bottom, moved.top - top) });
  }
}

function draw(view, data) {
  view.dataset.pending = "1"; // until drawn: what tests and the UI benchmark wait for
  return loadPlotly()
    .then((Plotly) => {
      const next = view.labNext;
      if (!next) return null; // a later call already drew the newest figure
      view.labNext = null;
      if (view.dataset.failed) { // an earlier try failed and left its message: start clean
        Plotly.purge(view);
        view.textContent = "";
        delete view.dataset.failed;
      }
      view.labDrawn = next;
      const shown = fit(next, view.clientWidth || window.innerWidth);
      return Plotly.react(view, shown.traces, shown.layout, shown.config).then(() => {
        view.dataset.drawn = String(Number(view.dataset.drawn ?? 0) + 1);
        if (!view.labNext) delete view.dataset.pending;
        if (data.reveal) reveal(view); // what the step changed
        followWidth(view, Plotly);
      });
    })
    .catch((error) => {
      delete view.dataset.pending;
      view.dataset.failed = "1";
      view.textContent = `The figure could not be drawn: ${error.message}. ` +
        "Start the app with `make run`, which serves plotly.js from ./static.";
    });
}

export default function (component) {
  const { data, parentElement } = component;
  let view = parentElement.querySelector(":scope > .lab-figure");
  if (!view) {
    view = document.createElement("div");
    view.className = "lab-figure";
    parentElement.appendChild(view);
  }
  if (data.traces === view.labTracesJson && data.layout === view.labLayoutJson &&
      JSON.stringify(data.config) === view.labConfigJson && !view.dataset.failed) {
    if (data.reveal && !view.dataset.pending) reveal(view); // a step that left it as it was
    return view.labCleanup; // the same figure again: nothing to redraw
  }
  view.labLayoutJson = data.layout;
  view.labConfigJson = JSON.stringify(data.config);
  // Traces that did not change are handed to plotly as the very objects it already drew, so
  // Plotly.react skips recomputing them (it compares trace arrays by identity).
  if (data.traces !== view.labTracesJson) {
    view.labTracesJson = data.traces;
    view.labTraces = JSON.parse(data.traces);
  }
  const layout = JSON.parse(data.layout);
  // Keep the space the figure will take while plotly.js loads, so the page does not jump.
  view.style.minHeight = `${layout.height ?? 450}px`;
  view.labNext = { traces: view.labTraces, layout, config: data.config };
  view.dataset.figureKey = data.key;
  // The figure in words (what it shows at this step): its name for a screen reader, which
  // reads nothing useful out of plotly's SVG.
  view.setAttribute("role", "img");
  view.setAttribute("aria-label", data.alt || "A chart");
  if (data.main) view.dataset.main = "1";
  // In a closed expander the figure is drawn when the expander opens, not at every step.
  const folded = view.closest("details:not([open])");
  if (folded) {
    view.labOpen ??= () => {
      if (!folded.open) return;
      folded.removeEventListener("toggle", view.labOpen);
      view.labOpen = null;
      if (view.labNext) draw(view, data);
    };
    folded.addEventListener("toggle", view.labOpen);
  } else {
    draw(view, data);
  }
  view.labCleanup ??= () => {
    view.labObserver?.disconnect();
    window.Plotly?.purge(view);
  };
  return view.labCleanup;
}
