// keel web front end: a small Markdown renderer that builds DOM nodes (docs/web.md).
//
// It never parses HTML: every piece of the model's text reaches the page through textContent or
// createTextNode, so `<img onerror=…>` in a reply is shown as text. Links keep only http(s) and
// mailto targets; anything else (`javascript:`, `data:`) is shown as plain text. Images are not
// loaded (a link to them instead). Covered: headings, paragraphs, line breaks, emphasis, strong,
// strike, inline code, fenced code, block quotes, lists (nested by indentation), tables, rules.
"use strict";

(function () {
  const SAFE_PROTOCOLS = new Set(["http:", "https:", "mailto:"]);

  /** The URL if it is safe to follow from the page, else null. */
  function safeUrl(raw) {
    const text = String(raw).trim();
    if (!/^(https?:\/\/|mailto:)/i.test(text)) return null;
    try {
      const url = new URL(text);
      return SAFE_PROTOCOLS.has(url.protocol) ? url.href : null;
    } catch (_err) {
      return null;
    }
  }

  function el(tag, cls) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    return node;
  }

  const LINKS = new Set(["image", "link", "autolink", "url"]);

  function link(parent, label, target) {
    const url = safeUrl(target);
    if (url === null) {
      // Inert: the label and the target as text, nothing to click.
      parent.appendChild(document.createTextNode(`${label} (${target})`));
      return;
    }
    const a = el("a");
    a.href = url;
    a.rel = "noopener noreferrer nofollow";
    a.target = "_blank";
    inline(label, a, true);
    parent.appendChild(a);
  }

  // -- inline ----------------------------------------------------------------------------------

  const INLINE = [
    ["code", /`+([^`]|[^`][\s\S]*?[^`])`+/y],
    ["image", /!\[([^\]]*)\]\(\s*<?([^\s)>]*)>?(?:\s+"[^"]*")?\s*\)/y],
    ["link", /\[([^\]]+)\]\(\s*<?([^\s)>]*)>?(?:\s+"[^"]*")?\s*\)/y],
    ["autolink", /<((?:https?:\/\/|mailto:)[^>\s]+)>/y],
    ["url", /https?:\/\/[^\s<>()]*[^\s<>().,;:!?'"]/y],
    ["strong", /\*\*(?=\S)([\s\S]*?\S)\*\*|__(?=\S)([\s\S]*?\S)__/y],
    ["strike", /~~(?=\S)([\s\S]*?\S)~~/y],
    ["em", /\*(?=[^\s*])([^*]*?[^\s*])\*|(?<![A-Za-z0-9])_(?=[^\s_])([^_]*?[^\s_])_(?![A-Za-z0-9])/y],
    ["break", /\n/y],
  ];
  const STARTS = /[`!\[<h*_~\n]/g;

  /** Inline Markdown of `text` into `parent`; `inLink`: no links inside (a link's label). */
  function inline(text, parent, inLink) {
    let plain = "";
    const flush = () => {
      if (plain) parent.appendChild(document.createTextNode(plain));
      plain = "";
    };
    let i = 0;
    while (i < text.length) {
      STARTS.lastIndex = i;
      const next = STARTS.exec(text);
      if (next === null) {
        plain += text.slice(i);
        break;
      }
      plain += text.slice(i, next.index);
      i = next.index;
      let matched = false;
      for (const [kind, pattern] of INLINE) {
        if (inLink && LINKS.has(kind)) continue;
        pattern.lastIndex = i;
        const m = pattern.exec(text);
        if (m === null) continue;
        flush();
        matched = true;
        i = pattern.lastIndex;
        if (kind === "code") {
          const code = el("code");
          code.textContent = m[1];
          parent.appendChild(code);
        } else if (kind === "image") {
          link(parent, `image: ${m[1] || m[2]}`, m[2]);
        } else if (kind === "link") {
          link(parent, m[1], m[2]);
        } else if (kind === "autolink" || kind === "url") {
          link(parent, m[1] || m[0], m[1] || m[0]);
        } else if (kind === "break") {
          parent.appendChild(el("br"));
        } else {
          const tag = { strong: "strong", em: "em", strike: "s" }[kind];
          const node = el(tag);
          inline(m[1] !== undefined ? m[1] : m[2], node, inLink);
          parent.appendChild(node);
        }
        break;
      }
      if (!matched) {
        plain += text[i];
        i += 1;
      }
    }
    flush();
  }

  // -- blocks ----------------------------------------------------------------------------------

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)/;
  const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
  const QUOTE = /^ {0,3}> ?/;
  const ITEM = /^( *)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

  function startsBlock(line) {
    return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
  }

  function cells(line) {
    let row = line.trim();
    if (row.startsWith("|")) row = row.slice(1);
    if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
    return row.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
  }

  function blocks(lines, parent) {
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (!line.trim()) {
        i += 1;
        continue;
      }
      const fence = FENCE.exec(line);
      if (fence) {
        const closer = new RegExp(`^ {0,3}${fence[1][0]}{${fence[1].length},}\\s*$`);
        const body = [];
        i += 1;
        while (i < lines.length && !closer.test(lines[i])) body.push(lines[i++]);
        i += 1;
        const pre = el("pre");
        const code = el("code");
        if (fence[2]) code.dataset.lang = fence[2];
        code.textContent = body.join("\n");
        pre.appendChild(code);
        parent.appendChild(pre);
        continue;
      }
      const heading = HEADING.exec(line);
      if (heading) {
        const h = el(`h${heading[1].length}`);
        inline(heading[2], h);
        parent.appendChild(h);
        i += 1;
        continue;
      }
      if (RULE.test(line)) {
        parent.appendChild(el("hr"));
        i += 1;
        continue;
      }
      if (QUOTE.test(line)) {
        const body = [];
        while (i < lines.length && lines[i].trim() && QUOTE.test(lines[i])) {
          body.push(lines[i++].replace(QUOTE, ""));
        }
        const quote = el("blockquote");
        blocks(body, quote);
        parent.appendChild(quote);
        continue;
      }
      const item = ITEM.exec(line);
      if (item) {
        i = list(lines, i, parent);
        continue;
      }
      if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes("-")) {
        const table = el("table");
        const head = el("tr");
        for (const c of cells(line)) {
          const th = el("th");
          inline(c, th);
          head.appendChild(th);
        }
        const thead = el("thead");
        thead.appendChild(head);
        table.appendChild(thead);
        const tbody = el("tbody");
        i += 2;
        while (i < lines.length && lines[i].includes("|") && lines[i].trim()) {
          const tr = el("tr");
          for (const c of cells(lines[i++])) {
            const td = el("td");
            inline(c, td);
            tr.appendChild(td);
          }
          tbody.appendChild(tr);
        }
        table.appendChild(tbody);
        const wrap = el("div", "table-wrap");
        wrap.appendChild(table);
        parent.appendChild(wrap);
        continue;
      }
      const para = [];
      while (i < lines.length && lines[i].trim() && (para.length === 0 || !startsBlock(lines[i]))) {
        para.push(lines[i++].trim());
      }
      const p = el("p");
      inline(para.join("\n"), p);
      parent.appendChild(p);
    }
  }

  function list(lines, i, parent) {
    const first = ITEM.exec(lines[i]);
    const indent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const node = el(ordered ? "ol" : "ul");
    if (ordered && parseInt(first[2], 10) !== 1) node.start = parseInt(first[2], 10);
    while (i < lines.length) {
      const m = ITEM.exec(lines[i]);
      if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
      const body = [m[3]];
      i += 1;
      const inner = indent + m[2].length + 1;
      while (i < lines.length) {
        const line = lines[i];
        const sub = ITEM.exec(line);
        if (!line.trim()) {
          // A blank line ends the item unless the next line is indented into it.
          const after = lines[i + 1];
          if (after !== undefined && after.trim() && after.search(/\S/) >= inner) {
            body.push("");
            i += 1;
            continue;
          }
          break;
        }
        if (sub && sub[1].length <= indent) break;
        if (!sub && line.search(/\S/) < inner && startsBlock(line)) break;
        body.push(line.slice(Math.min(inner, line.search(/\S/))));
        i += 1;
      }
      const li = el("li");
      if (body.length === 1) inline(body[0], li);
      else blocks(body, li);
      node.appendChild(li);
      while (i < lines.length && !lines[i].trim() && lines[i + 1] !== undefined && ITEM.test(lines[i + 1])) {
        const next = ITEM.exec(lines[i + 1]);
        if (next[1].length !== indent) break;
        i += 1;
      }
    }
    parent.appendChild(node);
    return i;
  }

  /** Render `text` (Markdown) into `parent`, replacing what it held. */
  function render(text, parent) {
    parent.replaceChildren();
    blocks(String(text).replace(/\r\n?/g, "\n").split("\n"), parent);
  }

  window.keelMarkdown = { render, inline, safeUrl };
})();
