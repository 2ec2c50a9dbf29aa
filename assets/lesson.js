// The lesson player (assets/lesson.html, written by lab/figures/lesson.py): unpacks the lesson,
// draws a step's figures with plotly.js, and asks its questions as the lab's pages do.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { lesson: null, step: 0, timer: null, answers: {}, asked: new Set() };
const PLAY_MS = 1000;

async function unpack() {
  const text = $("lesson-data").textContent.trim();
  const bytes = Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}

// Markdown as the lab's captions use it (**bold**, *italic*, `code`), on escaped text only.
function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;",
                                                   '"': "&quot;", "'": "&#39;" })[c]);
}
function markdown(text) {
  return escapeHtml(text)
    .replace(/`([^`]+)`/g, "<code>$1</code>")
    .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^*\w])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>")
    .replace(/&amp;nbsp;/g, "&nbsp;");
}
function shown(value) {
  return typeof value === "number" ? value.toLocaleString("en-US") : String(value);
}
function same(guess, answer) {
  return typeof answer === "number" ? Number(guess) === answer : guess === answer;
}

// A question is due (drawn above the step) from the step before the one that answers it; once
// answered it stays only around that step. Unanswered, it holds back what would answer it. One
// with an `until` step is gone after it (the page asks its next question there).
function gone(q, step) {
  return q.until !== null && step > q.until;
}
function due(q, step) {
  if (gone(q, step)) return false;
  return q.key in state.answers ? q.reveal - 1 <= step && step <= q.reveal : step + 1 >= q.reveal;
}
function held(step) {
  const names = new Set();
  let whole = false;
  for (const q of state.lesson.questions) {
    if (q.key in state.answers || step < q.reveal || gone(q, step)) continue;
    if (q.holds.length === 0) whole = true;
    q.holds.forEach((name) => names.add(name));
  }
  return { whole, names };
}

// A figure keeps its div from step to step (Plotly.react redraws it in place), in the order of
// this step's figures; a figure this step does not have goes.
function draw(container, figures, hold, whole) {
  const kept = new Map([...container.children].map((div) => [div.dataset.name, div]));
  for (const [name, fig] of Object.entries(figures)) {
    let div = kept.get(name);
    kept.delete(name);
    if (!div) {
      div = document.createElement("div");
      div.className = "figure";
      div.dataset.name = name;
    }
    container.appendChild(div);
    div.classList.toggle("held", whole || hold.has(name));
    div.setAttribute("aria-hidden", String(whole || hold.has(name)));
    Plotly.react(div, fig.data, fig.layout, state.lesson.config);
  }
  for (const div of kept.values()) {
    Plotly.purge(div);
    div.remove();
  }
}

function render() {
  const { lesson, step } = state;
  const view = lesson.steps[step];
  const last = lesson.steps.length - 1;
  const hold = held(step);
  $("step-label").textContent = `Step ${step} of ${last}`;
  $("scrubber").value = String(step);
  $("back").disabled = $("reset").disabled = step === 0;
  $("step").disabled = step === last;
  $("play").textContent = state.timer ? "Pause" : "Play";
  renderQuestions(step);
  $("held-note").hidden = !(hold.whole || hold.names.size);
  const caption = $("caption");
  caption.innerHTML = "<ul>" + view.caption.map((line) => `<li>${markdown(line)}</li>`).join("") +
    "</ul>";
  caption.classList.toggle("held", hold.whole);
  const counters = $("counters");
  counters.innerHTML = view.counters.map(([label, value]) =>
    `<div class="counter"><div class="label">${escapeHtml(label)}</div>` +
    `<div class="value${hold.names.has(label) ? " held" : ""}"><span>${escapeHtml(value)}` +
    "</span></div></div>").join("");
  counters.classList.toggle("held", hold.whole);
  const check = $("check");
  check.textContent = view.check.text;
  check.className = view.check.ok === null ? "" : view.check.ok ? "ok" : "bad";
  check.parentElement.classList.toggle("held", hold.whole);
  draw($("figures"), view.figures, hold.names, hold.whole);
  draw($("extras"), lesson.extras, hold.names, false);
}

function renderQuestions(step) {
  const box = $("questions");
  box.replaceChildren();
  for (const q of state.lesson.questions) {
    if (!due(q, step)) continue;
    const form = document.createElement("form");
    form.className = "question";
    form.dataset.key = q.key;
    const input = q.choices
      ? `<div class="choices">${q.choices.map((c) => `<label><input type="radio" name="${q.key}"` +
          ` value="${escapeHtml(c)}"> ${escapeHtml(c)}</label>`).join("")}</div>`
      : `<input type="number" min="0" step="1" name="${q.key}" placeholder="a number, then Enter"` +
          ` aria-label="Your prediction">`;
    form.innerHTML = `<div><strong>Predict, then reveal.</strong> ${markdown(q.text)}</div>` +
      `${input}<div><button type="submit" class="check">Check</button> ` +
      `<button type="button" class="show">Just show me</button></div>`;
    const verdict = document.createElement("div");
    verdict.className = "verdict";
    form.appendChild(verdict);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const value = q.choices ? form.querySelector("input:checked")?.value : form.elements[q.key].value;
      if (value === undefined || value === "") {
        verdict.className = "verdict empty";
        verdict.textContent = "Type or pick a prediction first, then Check.";
        return;
      }
      answer(q, q.choices ? value : Number(value));
    });
    form.querySelector(".show").addEventListener("click", () => answer(q, null));
    box.appendChild(form);
    const given = state.answers[q.key];
    if (given !== undefined) showVerdict(q, given, verdict);
  }
}

function answer(q, guess) {
  state.answers[q.key] = guess;
  render();
}
function showVerdict(q, guess, verdict) {
  const tail = ` ${escapeHtml(q.explanation)}`;
  if (guess === null) {
    verdict.className = "verdict shown";
    verdict.innerHTML = `The engine says <strong>${escapeHtml(shown(q.answer))}</strong>.${tail}`;
  } else if (same(guess, q.answer)) {
    verdict.className = "verdict right";
    verdict.innerHTML = `Right: <strong>${escapeHtml(shown(q.answer))}</strong>.${tail}`;
  } else {
    verdict.className = "verdict wrong";
    verdict.innerHTML = `Not quite: you said ${escapeHtml(shown(guess))}, the engine says ` +
      `<strong>${escapeHtml(shown(q.answer))}</strong>.${tail}`;
  }
  const guessed = Object.entries(state.answers).filter(([, g]) => g !== null);
  const right = guessed.filter(([key, g]) =>
    same(g, state.lesson.questions.find((x) => x.key === key).answer)).length;
  verdict.insertAdjacentHTML("beforeend",
    `<div class="score">Your score: ${right} of ${guessed.length} in this lesson.</div>`);
}

function go(step) {
  const last = state.lesson.steps.length - 1;
  state.step = Math.max(0, Math.min(last, step));
  if (state.step === last) pause();
  // Play stops where a new question is asked: the class predicts before the step answers it.
  const asking = state.lesson.questions.filter((q) => !(q.key in state.answers) && due(q, state.step));
  if (state.timer && asking.some((q) => !state.asked.has(q.key))) pause();
  asking.forEach((q) => state.asked.add(q.key));
  render();
}
function pause() {
  clearInterval(state.timer);
  state.timer = null;
}
function play() {
  if (state.timer) { pause(); render(); return; }
  if (state.step === state.lesson.steps.length - 1) state.step = 0;
  state.timer = setInterval(() => go(state.step + 1), PLAY_MS);
  render();
}

// Slides: every step's figures as PNGs (rendered by plotly.js here), in one uncompressed zip.
const CRC_TABLE = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});
function crc32(bytes) {
  let c = 0xffffffff;
  for (const b of bytes) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}
function zip(files) {
  const parts = [], central = [];
  let offset = 0;
  for (const { name, bytes } of files) {
    const nameBytes = new TextEncoder().encode(name);
    const crc = crc32(bytes);
    const header = (sig, extra) => {
      const h = new DataView(new ArrayBuffer(extra ? 46 : 30));
      let i = 0;
      const u32 = (v) => { h.setUint32(i, v, true); i += 4; };
      const u16 = (v) => { h.setUint16(i, v, true); i += 2; };
      u32(sig); if (extra) u16(20); u16(20); u16(0); u16(0); u16(0); u16(0x21);
      u32(crc); u32(bytes.length); u32(bytes.length); u16(nameBytes.length); u16(0);
      if (extra) { u16(0); u16(0); u16(0); u32(0); u32(offset); }
      return new Uint8Array(h.buffer);
    };
    const local = header(0x04034b50, false);
    parts.push(local, nameBytes, bytes);
    central.push(header(0x02014b50, true), nameBytes);
    offset += local.length + nameBytes.length + bytes.length;
  }
  const size = central.reduce((n, p) => n + p.length, 0);
  const end = new DataView(new ArrayBuffer(22));
  end.setUint32(0, 0x06054b50, true);
  end.setUint16(8, files.length, true);
  end.setUint16(10, files.length, true);
  end.setUint32(12, size, true);
  end.setUint32(16, offset, true);
  return new Blob([...parts, ...central, new Uint8Array(end.buffer)], { type: "application/zip" });
}
async function savePngs() {
  const { lesson } = state;
  const status = $("png-status");
  const files = [];
  const width = Math.max(600, $("figures").clientWidth);
  const digits = String(lesson.steps.length - 1).length;
  for (const [i, view] of lesson.steps.entries()) {
    status.textContent = `Rendering step ${i} of ${lesson.steps.length - 1}…`;
    for (const [name, fig] of Object.entries(view.figures)) {
      const url = await Plotly.toImage({ data: fig.data, layout: fig.layout },
        { format: "png", scale: 2, width, height: fig.layout.height || 450 });
      const bytes = Uint8Array.from(atob(url.split(",")[1]), (c) => c.charCodeAt(0));
      files.push({ name: `step_${String(i).padStart(digits, "0")}_${name}.png`, bytes });
    }
  }
  const link = document.createElement("a");
  link.href = URL.createObjectURL(zip(files));
  link.download = `${lesson.page}_steps.zip`;
  link.click();
  status.textContent = `${files.length} PNGs saved (${lesson.page}_steps.zip).`;
}

async function main() {
  const lesson = await unpack();
  lesson.questions.forEach((q, i) => { q.key = `q${i}`; });
  state.lesson = lesson;
  $("title").textContent = lesson.title;
  $("settings").textContent = lesson.settings;
  $("scrubber").max = String(lesson.steps.length - 1);
  $("reset").addEventListener("click", () => { pause(); go(0); });
  $("back").addEventListener("click", () => { pause(); go(state.step - 1); });
  $("step").addEventListener("click", () => go(state.step + 1));
  $("play").addEventListener("click", play);
  $("scrubber").addEventListener("input", (e) => { pause(); go(Number(e.target.value)); });
  $("png").addEventListener("click", () => savePngs().catch((error) => {
    $("png-status").textContent = `The PNGs could not be made: ${error}`;
  }));
  document.addEventListener("keydown", (e) => {
    if (e.target.closest && e.target.closest("input, textarea, select")) return;
    if (e.key === "ArrowRight") go(state.step + 1);
    else if (e.key === "ArrowLeft") { pause(); go(state.step - 1); }
    else if (e.key === "Home") { pause(); go(0); }
    else if (e.key === "p" || e.key === "P") play();
    else return;
    e.preventDefault();
  });
  go(0);
  document.body.dataset.ready = "true";
}

main().catch((error) => {
  document.body.insertAdjacentHTML("afterbegin",
    `<p role="alert">This lesson could not be opened: ${escapeHtml(error)}</p>`);
});
