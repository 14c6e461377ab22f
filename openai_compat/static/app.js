// openai-compat playground: calls the server's public API, exactly as a client would.
// No third-party code; served with a CSP that allows only this server.
"use strict";

const KEY_STORAGE = "openai-compat-api-key";
const state = {
  key: sessionStorage.getItem(KEY_STORAGE) || "",
  models: [],
  poll: null,
  last: null, // previous metrics sample, for rates and windowed latency
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("data-")) node.setAttribute(k, String(v));
    else node[k] = v;
  }
  for (const c of children) node.append(c);
  return node;
}

// ------------------------------------------------------------------ API calls

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function errorMessage(data) {
  // The error as the server phrased it, whatever API family's body it used.
  if (!data || typeof data !== "object") return "";
  if (data.error && typeof data.error === "object" && data.error.message) return data.error.message;
  if (typeof data.error === "string") return data.error;
  if (typeof data.message === "string") return data.message;
  if (data.detail) return typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail);
  return "";
}

async function api(path, body) {
  const headers = {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (state.key) headers["Authorization"] = "Bearer " + state.key;
  let resp;
  try {
    resp = await fetch(path, {
      method: body === undefined ? "GET" : "POST",
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    throw new ApiError(0, "The server could not be reached: " + e.message);
  }
  const text = await resp.text();
  let data = null;
  try {
    data = JSON.parse(text);
  } catch (e) {
    data = null;
  }
  if (!resp.ok) {
    const message = errorMessage(data) || text || resp.statusText;
    if (resp.status === 401) askForKey(message);
    throw new ApiError(resp.status, message);
  }
  return data === null ? text : data;
}

function askForKey(message) {
  $("auth").hidden = false;
  $("auth-message").textContent = message;
  $("api-key").focus();
}

function showError(target, err) {
  target.replaceChildren(
    el("p", { class: "error", role: "alert", text: (err.status ? `${err.status}: ` : "") + err.message })
  );
}

async function run(button, target, work) {
  button.disabled = true;
  target.classList.add("busy");
  try {
    await work();
  } catch (err) {
    showError(target, err);
  } finally {
    button.disabled = false;
    target.classList.remove("busy");
    // how many runs have finished: lets a reader (or a test) tell a new result from the last
    target.dataset.runs = String(parseInt(target.dataset.runs || "0", 10) + 1);
  }
}

// ------------------------------------------------------------------ models

function capable(card, capability) {
  if (capability === "tokens") return true;
  if (capability === "pages") {
    // ranks page images: reranks, and takes images (ColPali, a multimodal reranker)
    return (card.capabilities || []).includes("rerank") && (card.modalities || []).includes("image");
  }
  if ((capability === "embed" || capability === "image") && card.multivector) {
    // a vector per token (ColBERT, ColPali) has no one cosine to show: the Pages and
    // rerank panels score it (MaxSim)
    return false;
  }
  return (card.capabilities || []).includes(capability);
}

// What a panel needs when no served model can use it, and the config lines that add one
// (a [[models]] table of the server's --config file; docs/configuration.md).
const ENABLE = {
  embed: ["an embedding model", '[[models]]\nname = "all-MiniLM-L6-v2"\nmodel = "builtin:all-MiniLM-L6-v2"'],
  rerank: [
    "a cross-encoder (any embedding model also ranks, by cosine)",
    '[[models]]\nname = "mxbai-rerank-xsmall-v1"\nmodel = "mixedbread-ai/mxbai-rerank-xsmall-v1"',
  ],
  image: [
    "a CLIP-style model (texts and images in one space)",
    '[[models]]\nname = "clip-vit-base-patch32"\nmodel = "openai/clip-vit-base-patch32"',
  ],
  pages: [
    "a model that ranks page images (ColPali, ColQwen2, a multimodal reranker). Offline, " +
      "`openai-compat demo-models demo` writes a tiny one with random weights (it shows the " +
      "plumbing, not meaning) and demo/demo.toml serving it as demo-pages; a real one:",
    '[[models]]\nname = "colpali"\nmodel = "vidore/colpali-v1.3-hf"',
  ],
  sparse: [
    "a SPLADE model (sparse vectors)",
    '[[models]]\nname = "splade"\nmodel = "naver/splade-cocondenser-ensembledistil"\nkind = "sparse"',
  ],
};

function explainUnavailable(panel, capability, able) {
  // A panel no served model can use says so, and how to serve one, instead of an empty menu.
  const tab = document.querySelector(`.tab[data-panel="${panel.id.slice("panel-".length)}"]`);
  const missing = able.length === 0 && capability in ENABLE;
  tab.classList.toggle("unavailable", missing);
  panel.classList.toggle("unavailable", missing);
  if (missing) tab.title = `No served model: add ${ENABLE[capability][0]}`;
  else tab.removeAttribute("title");
  for (const part of panel.querySelectorAll(".controls, label.block, .drop, .run")) part.hidden = missing;
  let note = panel.querySelector(".enable");
  if (!missing) {
    if (note) note.remove();
    return;
  }
  if (!note) {
    note = el("div", { class: "enable" });
    panel.querySelector(".lead").after(note);
  }
  const [what, config] = ENABLE[capability];
  note.replaceChildren(
    el("p", { text: `No model this server serves can do this. Serve ${what}: add it to the server's config file (openai-compat serve --config models.toml), for example` }),
    el("pre", { class: "config", text: config }),
    el("p", { class: "hint", text: "Every model option: docs/configuration.md. The weights download from the model hub on the first start." })
  );
}

async function loadModels() {
  const list = await api("/v1/models");
  // aliases repeat a model under another id: show each served model once
  state.models = list.data.filter((m) => !m.root || m.root === m.id);
  for (const select of document.querySelectorAll("select[data-capability]")) {
    const capability = select.dataset.capability;
    const previous = select.value;
    const able = state.models.filter((m) => capable(m, capability));
    select.replaceChildren(...able.map((m) => el("option", { value: m.id, text: m.id })));
    if (able.some((m) => m.id === previous)) select.value = previous;
    select.disabled = able.length === 0;
    const panel = select.closest(".panel");
    const button = panel.querySelector(".run");
    if (button) button.disabled = able.length === 0;
    explainUnavailable(panel, capability, able);
  }
  updatePrompts();
  renderModelTable();
}

async function firstExample() {
  // The similarity panel opens with its example computed, not an empty result.
  if (!$("sim-run").disabled && !$("sim-result").dataset.runs) {
    await run($("sim-run"), $("sim-result"), similarity);
  }
}

function card(id) {
  return state.models.find((m) => m.id === id);
}

function updatePrompts() {
  const c = card($("sim-model").value);
  const select = $("sim-prompt");
  const names = c && c.prompts ? Object.keys(c.prompts) : [];
  select.replaceChildren(
    el("option", { value: "", text: names.length ? "(model default)" : "(none)" }),
    ...names.map((n) => el("option", { value: n, text: `${n}: "${c.prompts[n]}"` }))
  );
  select.disabled = names.length === 0;
}

function lines(id) {
  return $(id).value.split("\n").map((s) => s.trim()).filter((s) => s.length > 0);
}

// ------------------------------------------------------------------ similarity

function unit(v) {
  let n = 0;
  for (const x of v) n += x * x;
  n = Math.sqrt(n) || 1;
  return v.map((x) => x / n);
}

function dot(a, b) {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i] * b[i];
  return s;
}

function heat(value) {
  // -1 .. 1 -> pale to deep blue; text turns white on dark cells
  const t = Math.max(0, Math.min(1, (value + 1) / 2));
  return { bg: `hsl(215, 75%, ${Math.round(97 - t * 62)}%)`, fg: t > 0.62 ? "#fff" : "#111" };
}

async function similarity() {
  const texts = lines("sim-texts");
  const target = $("sim-result");
  if (texts.length < 2) throw new ApiError(0, "Enter at least two texts, one per line.");
  const body = { model: $("sim-model").value, input: texts, encoding_format: "float" };
  if ($("sim-prompt").value) body.input_type = $("sim-prompt").value;
  const resp = await api("/v1/embeddings", body);
  const vectors = resp.data.map((d) => d.embedding);
  if (!Array.isArray(vectors[0]) || Array.isArray(vectors[0][0])) {
    throw new ApiError(0, "This model does not return one vector per text.");
  }
  const units = vectors.map(unit);
  const table = el("table", { id: "sim-matrix", class: "matrix" });
  const head = el("tr", {}, el("th", { text: "" }));
  texts.forEach((t, j) => head.append(el("th", { scope: "col", title: t, text: `${j + 1}` })));
  table.append(el("thead", {}, head));
  const tbody = el("tbody");
  texts.forEach((t, i) => {
    const row = el("tr", {}, el("th", { scope: "row", title: t, text: `${i + 1}. ${t}` }));
    texts.forEach((u, j) => {
      const value = dot(units[i], units[j]);
      const cell = el("td", {
        "data-i": i,
        "data-j": j,
        "data-value": value,
        title: `cos(${i + 1}, ${j + 1}) = ${value}`,
        text: value.toFixed(3),
      });
      const c = heat(value);
      cell.style.background = c.bg;
      cell.style.color = c.fg;
      row.append(cell);
    });
    tbody.append(row);
  });
  table.append(tbody);
  target.replaceChildren(
    el("div", { class: "table-wrap" }, table),
    el("p", { class: "hint", text: `${resp.model}: ${vectors[0].length} dimensions, ${resp.usage.prompt_tokens} tokens.` })
  );
}

// ------------------------------------------------------------------ rerank

function bars(list, items, max) {
  for (const item of items) {
    const bar = el("span", { class: "bar" });
    bar.style.width = `${max > 0 ? Math.max(1, (100 * item.value) / max) : 0}%`;
    list.append(
      el(
        "li",
        item.attrs,
        el("span", { class: "name", text: item.label }),
        el("span", { class: "track" }, bar),
        el("span", { class: "score", text: item.value.toFixed(4) })
      )
    );
  }
  return list;
}

async function rerank() {
  const docs = lines("rerank-docs");
  const query = $("rerank-query").value;
  const resp = await api("/v1/rerank", {
    model: $("rerank-model").value,
    query,
    documents: docs,
    return_documents: true,
  });
  const max = Math.max(...resp.results.map((r) => r.relevance_score), 0);
  const items = resp.results.map((r) => ({
    label: docs[r.index],
    value: r.relevance_score,
    attrs: { "data-index": r.index, "data-score": r.relevance_score },
  }));
  $("rerank-result").replaceChildren(bars(el("ol", { id: "rerank-list", class: "bars" }), items, max));
}

// ------------------------------------------------------------------ tokens

async function tokens() {
  const resp = await api("/tokenize", {
    model: $("tok-model").value,
    prompt: $("tok-text").value,
    return_token_strs: true,
  });
  const limit = resp.max_model_len;
  const cut = limit !== null && resp.count > limit;
  const summary = el("p", { id: "tok-summary", "data-count": resp.count });
  summary.textContent =
    `${resp.count} tokens (special tokens included)` +
    (limit === null ? "" : `; the model takes at most ${limit}`) +
    (cut ? `: it truncates the last ${resp.count - limit}.` : ".");
  const list = el("div", { id: "tok-list", class: "tokens" });
  resp.tokens.forEach((id, i) => {
    const chip = el("span", {
      class: "tok" + (cut && i >= limit ? " cut" : ""),
      "data-id": id,
      "data-position": i,
      title: `#${i}: id ${id}` + (cut && i >= limit ? " (cut by truncation)" : ""),
      text: resp.token_strs[i],
    });
    list.append(chip);
  });
  $("tok-result").replaceChildren(summary, list);
}

// ------------------------------------------------------------------ images

function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(new ApiError(0, "The file could not be read."));
    reader.readAsDataURL(file);
  });
}

function chosenImage() {
  const file = $("img-file").files[0];
  if (!file) throw new ApiError(0, "Choose or drop an image first.");
  return file;
}

async function images() {
  const captions = lines("img-captions");
  if (captions.length === 0) throw new ApiError(0, "Enter at least one caption.");
  const model = $("img-model").value;
  const image = await readAsDataUrl(chosenImage());
  const [img, txt] = await Promise.all([
    api("/v1/embeddings", { model, input: [image], modality: "image", encoding_format: "float" }),
    api("/v1/embeddings", { model, input: captions, encoding_format: "float" }),
  ]);
  const v = unit(img.data[0].embedding);
  const scores = txt.data.map((d) => dot(v, unit(d.embedding)));
  const best = scores.indexOf(Math.max(...scores));
  const items = captions.map((c, i) => ({
    label: (i === best ? "★ " : "") + c,
    value: scores[i],
    attrs: { "data-caption": c, "data-score": scores[i], class: i === best ? "best" : "" },
  }));
  const max = Math.max(...scores.map((s) => Math.abs(s)));
  $("img-result").replaceChildren(
    el("p", { id: "img-best", text: `Best match: ${captions[best]}` }),
    bars(el("ol", { id: "img-list", class: "bars" }), items, max)
  );
}

async function previewImage() {
  const file = $("img-file").files[0];
  if (!file) return;
  const preview = $("img-preview");
  preview.src = await readAsDataUrl(file);
  preview.alt = file.name;
  preview.hidden = false;
}

// ------------------------------------------------------------------ pages

async function pages() {
  const files = [...$("pages-files").files];
  if (files.length === 0) throw new ApiError(0, "Choose or drop a few page images first.");
  const query = $("pages-query").value;
  const uris = await Promise.all(files.map(readAsDataUrl));
  const resp = await api("/v1/rerank", {
    model: $("pages-model").value,
    query,
    documents: uris.map((image) => ({ image })),
  });
  const list = el("ol", { id: "pages-list", class: "pages" });
  for (const r of resp.results) {
    const thumb = el("img", { src: uris[r.index], alt: files[r.index].name });
    list.append(
      el(
        "li",
        { "data-index": r.index, "data-name": files[r.index].name, "data-score": r.relevance_score },
        thumb,
        el("span", { class: "name", text: files[r.index].name }),
        el("span", { class: "score", text: r.relevance_score.toFixed(4) })
      )
    );
  }
  $("pages-result").replaceChildren(
    el("p", { id: "pages-best", text: `Best page: ${files[resp.results[0].index].name}` }),
    list
  );
}

// ------------------------------------------------------------------ sparse

async function sparse() {
  const typed = parseInt($("sparse-k").value, 10);
  const k = Number.isNaN(typed) ? 20 : typed; // whatever was typed goes to the server as is
  const resp = await api("/v1/embeddings", {
    model: $("sparse-model").value,
    input: $("sparse-text").value,
    top_k: k,
    return_tokens: true,
    encoding_format: "float",
  });
  const e = resp.data[0].embedding;
  const items = e.tokens
    .map((t, i) => ({ label: t, value: e.values[i], attrs: { "data-token": t, "data-weight": e.values[i] } }))
    .sort((a, b) => b.value - a.value);
  const max = items.length ? items[0].value : 0;
  $("sparse-result").replaceChildren(
    el("p", { class: "hint", text: `${items.length} largest of the vector's weights, ${resp.usage.prompt_tokens} tokens.` }),
    bars(el("ol", { id: "sparse-list", class: "bars" }), items, max)
  );
}

// ------------------------------------------------------------------ server

function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    if (m[2]) for (const p of m[2].matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[p[1]] = p[2];
    samples.push({ name: m[1], labels, value: parseFloat(m[3]) });
  }
  return samples;
}

function sum(samples, name, filter = () => true) {
  return samples.filter((s) => s.name === name && filter(s.labels)).reduce((a, s) => a + s.value, 0);
}

function latencyBuckets(samples) {
  const buckets = new Map();
  for (const s of samples) {
    if (s.name !== "openai_compat_request_duration_seconds_bucket") continue;
    const le = s.labels.le === "+Inf" ? Infinity : parseFloat(s.labels.le);
    buckets.set(le, (buckets.get(le) || 0) + s.value);
  }
  return buckets;
}

function quantile(now, before, q) {
  const les = [...now.keys()].sort((a, b) => a - b);
  const counts = les.map((le) => now.get(le) - (before ? before.get(le) || 0 : 0));
  const total = counts[counts.length - 1];
  if (!total) return null;
  for (let i = 0; i < les.length; i++) if (counts[i] >= q * total) return les[i];
  return null;
}

function seconds(le) {
  if (le === null) return "–";
  if (le === Infinity) return "> largest bucket";
  return le < 1 ? `≤ ${Math.round(le * 1000)} ms` : `≤ ${le} s`;
}

function renderModelTable(samples) {
  const tbody = $("srv-models").querySelector("tbody");
  tbody.replaceChildren(
    ...state.models.map((m) => {
      const queued = samples ? sum(samples, "openai_compat_queued_inputs", (l) => l.model === m.id) : null;
      // Residency (lazy models, idle unloads): live from /metrics, else as /v1/models said.
      const live = (samples || []).find((s) => s.name === "openai_compat_model_state" && s.labels.model === m.id && s.value === 1);
      const modelState = live ? live.labels.state : m.state || "loaded";
      const resident = samples ? sum(samples, "openai_compat_model_resident_bytes", (l) => l.model === m.id) : 0;
      return el(
        "tr",
        { "data-model": m.id, "data-state": modelState },
        el("td", { text: m.id }),
        el("td", { class: "state", text: modelState }),
        el("td", { class: "resident", text: samples && ["loaded", "unloading"].includes(modelState) ? `${(resident / 2 ** 20).toFixed(1)} MiB` : "–" }),
        el("td", { text: (m.capabilities || []).join(", ") }),
        el("td", { text: m.dimensions ?? "–" }),
        el("td", { text: m.max_input_tokens ?? "–" }),
        el("td", { class: "queued", text: queued === null ? "–" : String(queued) })
      );
    })
  );
}

function renderBatches(list) {
  const tbody = $("srv-batches").querySelector("tbody");
  if (!list.data.length) {
    tbody.replaceChildren(el("tr", {}, el("td", { colSpan: 5, class: "hint", text: "No batch jobs (POST /v1/batches)." })));
    return;
  }
  tbody.replaceChildren(
    ...list.data.map((b) => {
      const c = b.request_counts;
      const done = c.completed + c.failed;
      // completed lines in the accent colour, failed ones in the error colour
      const ok = el("span", { class: "bar ok" });
      const bad = el("span", { class: "bar failed" });
      ok.style.width = `${c.total ? (100 * c.completed) / c.total : 0}%`;
      bad.style.width = `${c.total ? (100 * c.failed) / c.total : 0}%`;
      const outcome = ["failed", "expired", "cancelled", "cancelling"].includes(b.status) ? "bad" : "";
      const status = el("td", { class: `status ${outcome}`, text: b.status });
      if (b.pending_reason) status.title = b.pending_reason;
      return el(
        "tr",
        { "data-batch": b.id, "data-done": done, "data-total": c.total },
        el("td", { class: "mono", text: b.id }),
        el("td", { text: b.endpoint }),
        status,
        el("td", {}, el("span", { class: "track" }, ok, bad), el("span", { class: "hint", text: ` ${done} / ${c.total}` })),
        el("td", { class: c.failed ? "bad" : "", text: String(c.failed) })
      );
    })
  );
}

async function pollMetrics() {
  try {
    const [text, batches] = await Promise.all([api("/metrics"), api("/v1/batches?limit=10")]);
    renderBatches(batches);
    const samples = parseMetrics(text);
    const now = performance.now();
    const total = sum(samples, "openai_compat_requests_total");
    const buckets = latencyBuckets(samples);
    const requests = $("srv-requests");
    requests.textContent = String(total);
    requests.dataset.value = String(total);
    if (state.last) {
      const rate = (total - state.last.total) / ((now - state.last.at) / 1000);
      $("srv-rate").textContent = `${rate.toFixed(1)} req/s`;
      const p50 = quantile(buckets, state.last.buckets, 0.5);
      const p99 = quantile(buckets, state.last.buckets, 0.99);
      $("srv-latency").textContent = p50 === null ? "no requests" : `${seconds(p50)} / ${seconds(p99)}`;
    }
    $("srv-inflight").textContent = String(sum(samples, "openai_compat_requests_in_flight"));
    renderModelTable(samples);
    state.last = { at: now, total, buckets };
    const updated = $("srv-updated");
    updated.textContent = new Date().toLocaleTimeString();
    updated.dataset.polls = String(parseInt(updated.dataset.polls || "0", 10) + 1);
    $("srv-result").replaceChildren();
  } catch (err) {
    showError($("srv-result"), err);
  }
}

// ------------------------------------------------------------------ wiring

function showPanel(name) {
  for (const tab of document.querySelectorAll(".tab")) {
    tab.setAttribute("aria-selected", String(tab.dataset.panel === name));
  }
  for (const panel of document.querySelectorAll(".panel")) {
    panel.hidden = panel.id !== `panel-${name}`;
  }
  clearInterval(state.poll);
  state.poll = null;
  if (name === "server") {
    pollMetrics();
    state.poll = setInterval(pollMetrics, 2000);
  }
  if (location.hash !== `#${name}`) history.replaceState(null, "", `#${name}`);
}

async function start() {
  for (const tab of document.querySelectorAll(".tab")) {
    tab.addEventListener("click", () => showPanel(tab.dataset.panel));
  }
  const actions = [
    ["sim-run", "sim-result", similarity],
    ["rerank-run", "rerank-result", rerank],
    ["tok-run", "tok-result", tokens],
    ["img-run", "img-result", images],
    ["pages-run", "pages-result", pages],
    ["sparse-run", "sparse-result", sparse],
  ];
  for (const [button, target, work] of actions) {
    $(button).addEventListener("click", () => run($(button), $(target), work));
  }
  $("sim-model").addEventListener("change", updatePrompts);
  $("img-file").addEventListener("change", previewImage);
  const drop = $("img-drop");
  drop.addEventListener("dragover", (e) => {
    e.preventDefault();
    drop.classList.add("over");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    if (e.dataTransfer.files.length) {
      $("img-file").files = e.dataTransfer.files;
      previewImage();
    }
  });
  const pageDrop = $("pages-drop");
  pageDrop.addEventListener("dragover", (e) => {
    e.preventDefault();
    pageDrop.classList.add("over");
  });
  pageDrop.addEventListener("dragleave", () => pageDrop.classList.remove("over"));
  pageDrop.addEventListener("drop", (e) => {
    e.preventDefault();
    pageDrop.classList.remove("over");
    if (e.dataTransfer.files.length) $("pages-files").files = e.dataTransfer.files;
  });
  $("key-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    state.key = $("api-key").value.trim();
    sessionStorage.setItem(KEY_STORAGE, state.key);
    try {
      await loadModels();
      $("auth").hidden = true;
      await firstExample();
    } catch (err) {
      if (err.status !== 401) askForKey(err.message);
    }
  });
  const initial = location.hash.slice(1);
  showPanel(document.getElementById(`panel-${initial}`) ? initial : "similarity");
  try {
    await loadModels();
    await firstExample();
  } catch (err) {
    if (err.status !== 401) showError($("sim-result"), err);
  }
  document.body.dataset.ready = "true";
}

document.addEventListener("DOMContentLoaded", start);
