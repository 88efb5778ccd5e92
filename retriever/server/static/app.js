// The search page: one form, POST /search, hits rendered with highlighted words and channel bars.
// The query is in the URL (?q=...: bookmarkable; Back / Forward search again); errors and an
// unreachable server are said, never "searching…" for ever.
"use strict";
const COLORS = { sparse: "#4e79a7", bm25: "#f28e2b", encoder: "#59a14f", dense: "#b07aa1", "dense-ef": "#9c755f" };
const $ = (id) => document.getElementById(id);

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem("apiKey");
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function escapeRegex(s) { return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"); }

// the snippet as HTML, every occurrence of a matched word (a whole word) wrapped in <mark>
function highlight(text, words) {
  const safe = escapeHtml(text);
  const ws = words.filter((w) => w.length > 1).sort((a, b) => b.length - a.length).map((w) => escapeRegex(escapeHtml(w)));
  if (!ws.length) return safe;
  return safe.replace(new RegExp("(^|[^\\p{L}\\p{N}])(" + ws.join("|") + ")(?![\\p{L}\\p{N}])", "giu"), "$1<mark>$2</mark>");
}

// one bar per hit, as long as its score relative to the top hit's, split by each channel's share
function bar(given, score, top) {
  // a completed fusion can give a channel a share below 0 (ranked below that channel's list): no bar for it
  const channels = Object.fromEntries(Object.entries(given).map(([c, v]) => [c, Math.max(v, 0)]));
  const total = Object.values(channels).reduce((a, b) => a + b, 0) || score || 1;
  const width = top > 0 ? Math.max(4, 100 * score / top) : 100;
  return '<div class="bar-box"><div class="bar" style="width:' + width.toFixed(1) + '%" title="' + escapeHtml(Object.entries(channels).map(([c, v]) => c + " " + (100 * v / total).toFixed(0) + "%").join(", ")) + '">'
    + Object.entries(channels).map(([c, v]) =>
      '<span class="share" data-channel="' + c + '" style="width:' + (100 * v / total).toFixed(1) + "%;background:" + (COLORS[c] || "#999") + '"></span>').join("")
    + "</div></div>";
}

function number(v) { return Math.abs(v) >= 10 ? v.toFixed(0) : v.toPrecision(2); }

function words(matched) {
  return Object.entries(matched).slice(0, 8).map(([w, v]) => "<code>" + escapeHtml(w) + " " + number(v) + "</code>").join("");
}

const TIMEOUT_MS = 30000; // a search or /info not answered by then is reported, not waited for
const NON_DEFAULT_K = () => $("k").value !== "10";

// fetch with a deadline; a network failure or the deadline becomes an Error whose message says so
async function call(url, options) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), TIMEOUT_MS);
  let res;
  try {
    res = await fetch(url, Object.assign({ signal: abort.signal }, options || {}));
  } catch (e) {
    throw new Error(abort.signal.aborted ? "the server did not answer within " + TIMEOUT_MS / 1000 + " s"
      : "the server cannot be reached (is serve running?)");
  } finally {
    clearTimeout(timer);
  }
  let data = null;
  try { data = await res.json(); } catch (e) { data = null; }
  return { res: res, data: data };
}

// a model given by path (build-index --model DIR) is shown by its last part
function baseName(name) { return String(name).replace(/[\\/]+$/, "").split(/[\\/]/).pop(); }

function showError(text) {
  $("status").innerHTML = '<span class="error">' + escapeHtml(text) + "</span>";
}

function hitHtml(h, top) {
  return '<li class="hit" value="' + h.rank + '"><div class="hit-head">'
    + (h.title ? '<span class="title">' + escapeHtml(h.title) + "</span>" : "")
    + (h.title !== h.id ? '<span class="id">' + escapeHtml(h.id) + "</span>" : "")
    + '<span class="score">' + h.score.toFixed(3) + "</span></div>"
    + (h.snippet ? '<p class="snippet">' + highlight(h.snippet, h.highlight || []) + "</p>" : "")
    + (h.channels && Object.keys(h.channels).length ? bar(h.channels, h.score, top) : "")
    + '<div class="words">' + words(h.matched || {}) + "</div></li>";
}

let current = null; // the search shown: {query, k, mode, top, shown, total}

function render(data, jsonHref, append) {
  const list = $("hits");
  if (!append) current.top = data.hits.length ? data.hits[0].score : 0;
  const html = data.hits.map((h) => hitHtml(h, current.top)).join("");
  if (append) list.insertAdjacentHTML("beforeend", html); else list.innerHTML = html;
  current.shown = data.offset + data.hits.length;
  current.total = data.total;
  const of = data.total_relation === "pool" ? " of " + data.total + " candidates" : data.total_relation === "gte"
    ? " of " + data.total + "+" : " of " + data.total;
  $("status").innerHTML = current.shown + " hit(s)" + of + ", mode " + escapeHtml(data.mode) + ", " + data.took_ms.toFixed(1)
    + ' ms · <a id="json-link" href="' + jsonHref + '">JSON</a>';
  $("more").hidden = !(data.hits.length === data.k && current.shown < data.total);
}

// the form's state as URL parameters (q, and k / mode where not the default)
function urlParams(query) {
  const params = new URLSearchParams({ q: query });
  if (NON_DEFAULT_K()) params.set("k", $("k").value);
  if ($("mode").value) params.set("mode", $("mode").value);
  return params;
}

async function search(offset) {
  const query = $("query").value;
  const body = { query: query, k: parseInt($("k").value, 10), offset: offset || 0 };
  if ($("mode").value) body.mode = $("mode").value;
  const params = new URLSearchParams({ q: query, k: body.k });
  if (body.mode) params.set("mode", body.mode);
  if (body.offset) params.set("offset", body.offset);
  if (!offset) { current = { query: query }; $("more").hidden = true; }
  $("status").textContent = "searching…";
  let answer;
  try {
    answer = await call("/search", { method: "POST", headers: headers(), body: JSON.stringify(body) });
  } catch (e) {
    showError(e.message);
    return;
  }
  const { res, data } = answer;
  if (!res.ok) {
    if (!offset) $("hits").innerHTML = "";
    showError(res.status + ": " + (data && data.detail ? String(data.detail) : res.statusText || "error"));
    if (res.status === 401) $("key-row").hidden = false;
    return;
  }
  render(data, "/search?" + params.toString(), Boolean(offset));
}

// the search named by the page's URL (?q=...&k=...&mode=...): on load and on Back / Forward
function fromUrl() {
  const params = new URLSearchParams(location.search);
  const q = params.get("q") || "";
  $("query").value = q;
  if (params.get("k")) $("k").value = params.get("k");
  if (params.get("mode") !== null && [...$("mode").options].some((o) => o.value === params.get("mode"))) $("mode").value = params.get("mode");
  if (q) {
    search(0);
  } else {
    $("hits").innerHTML = ""; $("status").textContent = ""; $("more").hidden = true;
  }
}

function submit(event) {
  event.preventDefault();
  const url = "?" + urlParams($("query").value).toString();
  if (url !== location.search) history.pushState(null, "", url);
  search(0);
}

async function loadInfo() {
  let answer;
  try {
    answer = await call("/info", { headers: headers() });
  } catch (e) {
    $("info").textContent = "";
    showError(e.message);
    return false;
  }
  const { res, data: info } = answer;
  if (res.status === 401) { $("key-row").hidden = false; $("info").textContent = "API key needed"; return false; }
  if (!res.ok || !info) { showError("/info: " + res.status + " " + (info && info.detail ? info.detail : res.statusText)); return false; }
  // the model and adapter by name only (never a local path)
  $("info").textContent = info.documents + " documents · " + info.describe + " · model " + baseName(info.model.name)
    + (info.adapter ? " + " + baseName(info.adapter.name) : "") + (info.encoder ? " · encoder " + info.encoder : "");
  $("info").title = "generation " + info.generation + ", loaded " + info.loaded_at;
  const mode = $("mode");
  while (mode.options.length > 1) mode.remove(1);
  for (const m of info.modes) {
    const o = document.createElement("option");
    o.value = m; o.textContent = m; mode.appendChild(o);
  }
  $("legend").innerHTML = info.channels.map((c) => '<span><i style="background:' + (COLORS[c] || "#999") + '"></i>' + c + "</span>").join("");
  document.body.dataset.ready = "1";
  return true;
}

$("search-form").addEventListener("submit", submit);
$("more").addEventListener("click", () => search(current ? current.shown : 0));
window.addEventListener("popstate", fromUrl);
$("api-key").addEventListener("change", async (e) => { sessionStorage.setItem("apiKey", e.target.value); if (await loadInfo()) fromUrl(); });
loadInfo().then((ok) => { if (ok) fromUrl(); });
