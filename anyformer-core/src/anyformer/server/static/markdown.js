// A model's markdown as safe DOM nodes: marked parses it, DOMPurify keeps an allowlist, the caller appends
// the fragment. Raw HTML and images in a reply are shown as the text they are; links keep only http(s)
// and mailto targets and open in a new tab. Nothing here assigns innerHTML.
"use strict";

const ALLOWED_TAGS = [
  "a", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "li", "ol", "p",
  "pre", "strong", "table", "tbody", "td", "th", "thead", "tr", "ul", "input",
];
const ALLOWED_ATTR = ["href", "title", "class", "type", "checked", "disabled", "align"];
const SAFE_URL = /^(?:https?:|mailto:)/i;

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

const parser = new window.marked.Marked({
  gfm: true,
  breaks: true,
  renderer: {
    // Raw HTML from a model is text to read, never markup.
    html(token) { return escapeHtml(token.text); },
    // An image would make the browser fetch what the model chose: show its markdown instead.
    image(token) { return escapeHtml(`![${token.text}](${token.href})`); },
  },
});

window.DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    const href = node.getAttribute("href") || "";
    if (!SAFE_URL.test(href)) node.removeAttribute("href");
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

// The fragment of nodes `text` renders to (markdown, sanitised).
function renderMarkdown(text) {
  return window.DOMPurify.sanitize(parser.parse(text), {
    ALLOWED_TAGS,
    ALLOWED_ATTR,
    ALLOWED_URI_REGEXP: SAFE_URL,
    ADD_ATTR: ["target", "rel"],
    RETURN_DOM_FRAGMENT: true,
  });
}

window.renderMarkdown = renderMarkdown;
