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

function followWidth(view, Plotly) {
  // Plotly sizes an autosized plot once, when it draws; redraw it when its column changes width
  // (window resized, sidebar opened or closed).
  if (view.labObserver) return;
  let width = view.clientWidth;
  view.labObserver = new ResizeObserver(() => {
    if (view.clientWidth !== width && view.clientWidth > 0) {
      width = view.clientWidth;
      Plotly.Plots.resize(view);
    }
  });
  view.labObserver.observe(view);
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
  view.dataset.pending = "1"; // until drawn: what tests and the UI benchmark wait for
  loadPlotly()
    .then((Plotly) => {
      const next = view.labNext;
      if (!next) return null; // a later call already drew the newest figure
      view.labNext = null;
      if (view.dataset.failed) { // an earlier try failed and left its message: start clean
        Plotly.purge(view);
        view.textContent = "";
        delete view.dataset.failed;
      }
      return Plotly.react(view, next.traces, next.layout, next.config).then(() => {
        view.dataset.drawn = String(Number(view.dataset.drawn ?? 0) + 1);
        if (!view.labNext) delete view.dataset.pending;
        if (data.reveal) view.scrollIntoView({ block: "nearest" }); // what the step changed
        followWidth(view, Plotly);
      });
    })
    .catch((error) => {
      delete view.dataset.pending;
      view.dataset.failed = "1";
      view.textContent = `The figure could not be drawn: ${error.message}. ` +
        "Start the app with `make run`, which serves plotly.js from ./static.";
    });
  view.labCleanup ??= () => {
    view.labObserver?.disconnect();
    window.Plotly?.purge(view);
  };
  return view.labCleanup;
}
