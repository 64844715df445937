// The chat page: conversations kept in this browser, replies streamed from /v1/chat/completions and
// rendered as sanitised markdown (markdown.js), the chosen model's verdicts from /api/check.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE_KEY = "anyformer-conversations";
const CURRENT_KEY = "anyformer-current";

let conversations = loadConversations();
let current = null;
let controller = null;
let pending = [];  // attachments for the next message: {kind, name, url, format}

// ---- storage ------------------------------------------------------------------------------------

function loadConversations() {
  try {
    const list = JSON.parse(localStorage.getItem(STORE_KEY) || "[]");
    return Array.isArray(list) ? list : [];
  } catch (e) {
    return [];
  }
}

// Keep every conversation; when the browser's storage is full, keep them without attachments' data.
function saveConversations() {
  const note = $("storage-note");
  try {
    localStorage.setItem(STORE_KEY, JSON.stringify(kept()));
    note.hidden = true;
  } catch (e) {
    const light = kept().map((c) => ({
      ...c,
      messages: c.messages.map((m) => ({ ...m, attachments: (m.attachments || []).map((a) => ({ ...a, url: null })) })),
    }));
    try {
      localStorage.setItem(STORE_KEY, JSON.stringify(light));
      note.textContent = "Browser storage is full: attachments are not kept after a reload.";
    } catch (e2) {
      note.textContent = "Browser storage is full: this conversation is not kept after a reload.";
    }
    note.hidden = false;
  }
  if (current) localStorage.setItem(CURRENT_KEY, current.id);
}

// The conversations worth keeping: those with a message.
function kept() {
  return conversations.filter((c) => c.messages.length);
}

function newConversation() {
  return { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8), title: "", messages: [], updated: Date.now() };
}

// ---- the sidebar --------------------------------------------------------------------------------

function showConversations() {
  const items = conversations
    .filter((c) => c.messages.length)
    .sort((a, b) => b.updated - a.updated)
    .map((c) => {
      const li = document.createElement("li");
      li.dataset.id = c.id;
      if (current && c.id === current.id) li.className = "current";
      const title = document.createElement("button");
      title.className = "title";
      title.textContent = c.title || "(untitled)";
      title.title = c.title;
      title.addEventListener("click", () => openConversation(c.id));
      const remove = document.createElement("button");
      remove.className = "delete";
      remove.textContent = "×";
      remove.title = "delete this conversation";
      remove.addEventListener("click", () => deleteConversation(c.id));
      li.append(title, remove);
      return li;
    });
  $("conversations").replaceChildren(...items);
}

function openConversation(id) {
  if (controller) return;
  current = conversations.find((c) => c.id === id) || null;
  if (!current) { current = newConversation(); conversations.push(current); }
  if (current.model) $("model").value = current.model;
  $("system").value = current.system || "";
  $("log").replaceChildren();
  current.messages.forEach((message, index) => showMessage(message, index));
  if (!current.messages.length) showEmpty();
  localStorage.setItem(CURRENT_KEY, current.id);
  showConversations();
}

function deleteConversation(id) {
  conversations = conversations.filter((c) => c.id !== id);
  saveConversations();
  if (current && current.id === id) startNew();
  else showConversations();
}

function startNew() {
  if (controller) return;
  current = newConversation();
  conversations.push(current);
  $("log").replaceChildren();
  showEmpty();
  showConversations();
}

function showEmpty() {
  const p = document.createElement("p");
  p.id = "empty";
  p.textContent = "Pick a model, type a message, press Enter. Shift+Enter adds a line.";
  $("log").appendChild(p);
}

// ---- messages -----------------------------------------------------------------------------------

function headers() {
  const h = { "Content-Type": "application/json" };
  if ($("key").value) h["Authorization"] = "Bearer " + $("key").value;
  return h;
}

async function errorText(response) {
  try { const body = await response.json(); return `${body.error.code}: ${body.error.message}`; }
  catch (e) { return `HTTP ${response.status}`; }
}

function addError(text) {
  const div = document.createElement("div");
  div.className = "msg error";
  div.textContent = text;
  $("log").appendChild(div);
}

// A message's element: the text (markdown for replies), its attachments, then what is known about it.
function showMessage(message, index) {
  $("empty")?.remove();
  const div = document.createElement("div");
  div.className = "msg " + message.role;
  const body = document.createElement("div");
  body.className = "body";
  div.appendChild(body);
  if (message.role === "assistant") renderReply(body, message.content, null);
  else body.textContent = message.content;
  for (const a of message.attachments || []) div.appendChild(attachmentElement(a));
  if (message.role === "assistant") finishReply(div, message, index);
  $("log").appendChild(div);
  $("log").scrollTop = $("log").scrollHeight;
  return div;
}

function attachmentElement(a) {
  if (!a.url) {
    const span = document.createElement("span");
    span.className = "meta";
    span.textContent = `[${a.name}: not kept]`;
    return span;
  }
  const element = document.createElement(a.kind === "image" ? "img" : "audio");
  element.src = a.url;
  if (a.kind === "image") { element.className = "attachment"; element.alt = a.name; }
  else element.controls = true;
  return element;
}

// The settled reply as markdown, then the unsettled rest of a draft (a text-diffusion model's) in grey.
function renderReply(body, reply, draft) {
  const extends_ = draft !== null && draft.startsWith(reply);
  body.replaceChildren(window.renderMarkdown(draft === null || extends_ ? reply : ""));
  addCopyButtons(body);
  if (draft === null) return;
  const rest = document.createElement("span");
  rest.className = "draft";
  rest.textContent = extends_ ? draft.slice(reply.length) : draft;
  body.appendChild(rest);
}

function addCopyButtons(body) {
  for (const pre of body.querySelectorAll("pre")) {
    const code = pre.querySelector("code");
    const button = document.createElement("button");
    button.className = "copy";
    button.textContent = "Copy";
    button.addEventListener("click", async () => {
      const text = (code || pre).textContent;
      try { await navigator.clipboard.writeText(text); button.textContent = "Copied"; }
      catch (e) { button.textContent = "Copy failed"; }
      setTimeout(() => { button.textContent = "Copy"; }, 1500);
    });
    pre.appendChild(button);
  }
}

// Under a reply: how it ended, its speed, and Regenerate on the latest one.
function finishReply(div, message, index) {
  const meta = document.createElement("span");
  meta.className = "meta";
  meta.textContent = [message.finish, message.tokens ? `${message.tokens} tokens` : ""].filter(Boolean).join(" · ");
  const stats = document.createElement("span");
  stats.className = "stats";
  const parts = [];
  if (message.ttft_ms != null) parts.push(`TTFT ${Math.round(message.ttft_ms)} ms`);
  if (message.tok_s != null) parts.push(`${message.tok_s.toFixed(1)} tok/s`);
  stats.textContent = parts.join(" · ");
  div.append(meta, stats);
  if (current && index === current.messages.length - 1) {
    const actions = document.createElement("span");
    actions.className = "actions";
    const again = document.createElement("button");
    again.className = "regenerate";
    again.textContent = "Regenerate";
    again.addEventListener("click", regenerate);
    actions.appendChild(again);
    div.appendChild(actions);
  }
}

// The conversation as the API takes it: the system prompt first, attachments as content parts.
function apiMessages() {
  const out = [];
  const system = $("system").value.trim();
  if (system) out.push({ role: "system", content: system });
  for (const m of current.messages) {
    const media = (m.attachments || []).filter((a) => a.url);
    if (!media.length) { out.push({ role: m.role, content: m.content }); continue; }
    const parts = [{ type: "text", text: m.content }];
    for (const a of media) {
      if (a.kind === "image") parts.push({ type: "image_url", image_url: { url: a.url } });
      else parts.push({ type: "input_audio", input_audio: { data: a.url.split(",")[1], format: a.format } });
    }
    out.push({ role: m.role, content: parts });
  }
  return out;
}

async function send() {
  const text = $("prompt").value.trim();
  const model = $("model").value.trim();
  if (!text || !model || controller) return;
  localStorage.setItem("anyformer-model", model);
  $("prompt").value = "";
  const message = { role: "user", content: text, attachments: pending };
  pending = [];
  $("attachments").replaceChildren();
  current.messages.push(message);
  if (!current.title) current.title = text.slice(0, 60);
  showMessage(message, current.messages.length - 1);
  await reply(model);
}

async function regenerate() {
  if (controller || !current.messages.length) return;
  if (current.messages[current.messages.length - 1].role === "assistant") {
    current.messages.pop();
    [...$("log").querySelectorAll(".msg.assistant")].pop()?.remove();
  }
  for (const error of $("log").querySelectorAll(".msg.error")) error.remove();
  const model = $("model").value.trim();
  if (model) await reply(model);
}

// Stream the model's reply to the conversation so far and keep it.
async function reply(model) {
  current.model = model;
  current.system = $("system").value;
  current.updated = Date.now();
  saveConversations();
  showConversations();
  for (const old of $("log").querySelectorAll(".actions")) old.remove();
  const div = document.createElement("div");
  div.className = "msg assistant streaming";
  const body = document.createElement("div");
  body.className = "body";
  div.appendChild(body);
  $("log").appendChild(div);
  // anyformer_preview: a backend that refines its answer in place (a text-diffusion model) also sends
  // the whole answer as it stands, shown greyed after the settled text until it settles.
  const request = {
    model, messages: apiMessages(), stream: true, stream_options: { include_usage: true }, anyformer_preview: true,
  };
  if ($("max-tokens").value) request.max_tokens = Number($("max-tokens").value);
  if ($("temperature").value !== "") request.temperature = Number($("temperature").value);
  controller = new AbortController();
  $("send").disabled = true; $("stop").disabled = false;
  const started = performance.now();
  let text = "", finish = "", usage = null, draft = null, timings = null, firstAt = null;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), signal: controller.signal, body: JSON.stringify(request),
    });
    if (!response.ok) throw new Error(await errorText(response));
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const line = buffer.slice(0, end).trim();
        buffer = buffer.slice(end + 2);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const data = JSON.parse(line.slice(6));
        if (data.error) throw new Error(`${data.error.code}: ${data.error.message}`);
        if (data.usage) usage = data.usage;
        if (data.timings) timings = data.timings;
        for (const choice of data.choices || []) {
          if (choice.delta.content && firstAt === null) firstAt = performance.now();
          text += choice.delta.content || "";
          draft = typeof choice.delta.anyformer_preview === "string" ? choice.delta.anyformer_preview : null;
          if (choice.finish_reason) finish = choice.finish_reason;
        }
        renderReply(body, text, draft);
        $("log").scrollTop = $("log").scrollHeight;
      }
    }
  } catch (error) {
    if (error.name === "AbortError") finish = "stopped";
    else addError(error.message);
  } finally {
    renderReply(body, text, null);
    div.classList.remove("streaming");
    const message = { role: "assistant", content: text, finish, tokens: usage ? usage.completion_tokens : null };
    // TTFT as this page saw it (loading, queueing and the network included); speed as the server measured it.
    if (firstAt !== null) message.ttft_ms = firstAt - started;
    if (timings && timings.predicted_per_second) message.tok_s = timings.predicted_per_second;
    if (text) current.messages.push(message);
    finishReply(div, message, text ? current.messages.length - 1 : -1);
    current.updated = Date.now();
    saveConversations();
    controller = null;
    $("send").disabled = false; $("stop").disabled = true;
  }
}

// ---- attachments --------------------------------------------------------------------------------

function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function attach(files) {
  for (const file of files) {
    const kind = file.type.startsWith("image/") ? "image" : file.type.startsWith("audio/") ? "audio" : null;
    if (!kind) { addError(`${file.name}: only images and WAV or MP3 audio can be attached`); continue; }
    const format = /mpeg|mp3/.test(file.type) ? "mp3" : "wav";
    pending.push({ kind, name: file.name, url: await readAsDataUrl(file), format });
    const chip = document.createElement("span");
    chip.className = "chip";
    chip.textContent = `${kind}: ${file.name}`;
    $("attachments").appendChild(chip);
  }
}

// ---- models and their verdicts ------------------------------------------------------------------

async function loadModels() {
  const response = await fetch("/v1/models", { headers: headers() });
  if (!response.ok) return;
  const list = (await response.json()).data;
  $("models").replaceChildren(...list.map((m) => {
    const option = document.createElement("option");
    option.value = m.id;
    option.label = m.loaded ? `${m.id} (loaded${m.backend ? ", " + m.backend : ""})` : m.id;
    return option;
  }));
  if (!$("model").value && list.length) $("model").value = list[0].id;
}

async function check() {
  const model = $("model").value.trim();
  const box = $("verdicts");
  if (!model) { box.textContent = "Type a model first."; return; }
  box.textContent = "Asking every backend…";
  const response = await fetch("/api/check?model=" + encodeURIComponent(model), { headers: headers() });
  if (!response.ok) { box.textContent = await errorText(response); return; }
  const result = await response.json();
  const table = document.createElement("table");
  if (!result.verdicts.length) box.textContent = "No backend plugins are installed.";
  for (const v of result.verdicts) {
    const row = table.insertRow();
    row.insertCell().textContent = v.backend === result.chosen ? "→" : "";
    const name = row.insertCell(); name.textContent = v.backend;
    if (v.backend === result.chosen) name.className = "chosen";
    const verdict = row.insertCell();
    verdict.textContent = v.ok ? "ok" : v.code;
    verdict.className = v.ok ? "ok" : "refused";
    const why = row.insertCell();
    if (v.ok) {
      const e = v.estimate, mb = (b) => (b / 1e6).toFixed(0) + " MB";
      why.textContent = `${mb(e.gpu_bytes)} GPU, ${mb(e.ram_bytes)} RAM` + (e.tok_per_sec ? `, ~${e.tok_per_sec.toFixed(0)} tok/s` : "");
    } else {
      why.textContent = v.reason + (v.need ? ` (need ${(v.need / 1e6).toFixed(0)} MB)` : "");
    }
  }
  if (result.verdicts.length) box.replaceChildren(table);
}

// ---- start --------------------------------------------------------------------------------------

$("key").value = localStorage.getItem("anyformer-key") || "";
$("key").addEventListener("change", () => { localStorage.setItem("anyformer-key", $("key").value); loadModels(); });
$("model").value = localStorage.getItem("anyformer-model") || "";
$("model").addEventListener("change", () => { if ($("model").value.trim()) check(); });
$("send").addEventListener("click", send);
$("stop").addEventListener("click", () => controller && controller.abort());
$("check").addEventListener("click", check);
$("clear").addEventListener("click", startNew);
$("attach").addEventListener("change", (e) => { attach([...e.target.files]); e.target.value = ""; });
$("prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); } });
openConversation(localStorage.getItem(CURRENT_KEY) || "");
loadModels();
