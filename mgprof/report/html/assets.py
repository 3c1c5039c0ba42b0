"""report.html's style sheet and script (inline: the page loads nothing from anywhere).

The script switches views (``#view=kernels``, ``#view=steps&rank=1``; a ``#sec-...`` link opens
the view holding that section), filters every view's charts and tables to the rank the selector
names, and draws a view's charts (Plotly) and tables from the page's JSON block only when the
view is first shown, or shown for another rank: a 16-rank report opens as fast as a 2-rank one.
Long text cells show one line (the whole text on hover, or on a click). Tables sort on a header
click (again: reversed; a third time: the original order, the tree for
regions) and filter on a text box (a link can set both: ``#view=kernels&table=kernels-table&
sort=3&dir=asc&filter=gemm``); cells are set with ``textContent``, never parsed as HTML.
Attributes it sets for tests and tools: ``data-rendered`` on a drawn chart,
``data-view-rendered`` and ``data-rank`` on a drawn view, ``data-rows`` on a drawn table and
``data-ready-ms`` (``performance.now()`` when the first view was drawn) and ``data-script-ms``
(when this script began, plotly.js loaded) on ``<html>``. A failure
is shown on the page (not only in the console), so a reader knows a chart is missing rather
than assuming there was no data.
"""

from __future__ import annotations

__all__ = ["CSS", "JS", "MAX_TABLE_ROWS"]

MAX_TABLE_ROWS = 500
"""Rows a table draws (after filtering and sorting); it says how many more there are."""

CSS = """
body{font-family:system-ui,sans-serif;margin:0 auto;max-width:1280px;padding:0 1rem 3rem;
color:#1d1d1f}
h1{font-size:1.5rem}h2{font-size:1.2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem;
margin-top:2rem}h3{font-size:1rem;margin:1.4rem 0 .4rem}
h2.view-title{border:0;margin:1rem 0 .4rem;font-size:1.3rem}
nav.tabs{position:sticky;top:0;z-index:10;background:#fff;border-bottom:2px solid #ddd;
display:flex;flex-wrap:wrap;align-items:center;gap:.2rem;padding:.4rem 0}
nav.tabs a{padding:.35rem .8rem;border-radius:4px 4px 0 0;text-decoration:none;color:#1565c0}
nav.tabs a.active{background:#1565c0;color:#fff}
nav.tabs a.findings-link{margin-left:auto;color:#555}
.rank-picker{margin-left:.8rem;font-size:.9rem}
table{border-collapse:collapse;margin:.6rem 0;font-size:.9rem}
th,td{padding:.2rem .6rem;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.na{color:#888}
.facts th{font-weight:600}
.notice{border:1px solid #e0a800;background:#fff8e1;padding:.6rem;margin:.6rem 0}
.callout{border-left:4px solid #ef6c00;background:#fff3e0;padding:.5rem .8rem}
.note{font-style:italic;color:#555}.brief{color:#555}.footnotes{color:#666;font-size:.85rem}
.chart{min-height:300px;margin:.8rem 0}
.cards{display:flex;flex-wrap:wrap;gap:.6rem;margin:.8rem 0}
.cards div{border:1px solid #ddd;border-radius:6px;padding:.4rem .8rem;min-width:8rem}
.cards dt{font-size:.8rem;color:#666}.cards dd{margin:0;font-size:1.1rem;font-weight:600}
.vtable .tools{display:flex;gap:.8rem;align-items:center;margin-top:.8rem}
.vtable .tools input{padding:.25rem .4rem;min-width:16rem}
.vtable .count{color:#666;font-size:.85rem}
.vtable .scroll{max-height:70vh;overflow:auto;border:1px solid #eee}
.vtable table{margin:0;width:100%}
.vtable th{position:sticky;top:0;background:#f5f5f5;cursor:pointer;user-select:none;
vertical-align:bottom}
.vtable th[aria-sort=ascending]::after{content:" \\25b2"}
.vtable th[aria-sort=descending]::after{content:" \\25bc"}
.vtable td.text{max-width:36rem;white-space:nowrap;overflow:hidden;text-overflow:ellipsis;
cursor:default}
.vtable td.text.open{white-space:normal;word-break:break-word}
.switch{display:block;margin:.8rem 0 0}
.findings{list-style:none;padding:0}
.finding{border-left:4px solid #999;padding:.4rem .8rem;margin:.6rem 0;background:#fafafa}
.finding.high{border-color:#c62828}.finding.medium{border-color:#ef8f00}
.finding.low{border-color:#0277bd}.finding.info{border-color:#9e9e9e}
.finding .head{font-weight:600}.finding .sev{text-transform:uppercase;font-size:.8rem}
.finding .rule{color:#888;font-weight:400;font-size:.8rem}
.finding dt{font-weight:600;float:left;clear:left;width:6.5rem}
.finding dd{margin-left:7rem;white-space:pre-wrap}
details summary h2{display:inline-block;border:0}
#mgprof-errors{color:#c62828;white-space:pre-wrap}
.failure h2{color:#c62828}
.failure pre{background:#f6f6f6;padding:.6rem;overflow-x:auto;font-size:.85rem}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.88em;
background:#f3f3f3;border-radius:3px;padding:0 .25em}
.study .lines{list-style:none;padding:0;margin:.4rem 0;color:#333}
.study .lines li{margin:.15rem 0}
.study .notes li{color:#555;margin:.25rem 0}
.study .scroll{overflow-x:auto}
.study table.cells td.na{color:#888}
.study table.cells td:first-child,.study table.cells td.num,.study table.cells td.links{
white-space:nowrap}
.study table.cells th{vertical-align:bottom}
.study .verdict{font-size:1rem;line-height:1.45}
.study .legend-note{color:#666;font-size:.85rem}
"""

JS = """
(function () {
  "use strict";
  var MAX_ROWS = __MAX_ROWS__;
  var started = performance.now();
  var box = document.getElementById("mgprof-errors");
  function report(msg) { box.hidden = false; box.textContent += msg + "\\n"; }
  window.addEventListener("error", function (e) { report("script error: " + e.message); });
  var data = JSON.parse(document.getElementById("mgprof-charts").textContent);
  var strings = data.strings || [];
  function unintern(v) {
    // "\u0000<n>" is strings[n]: a name that repeats on every rank is stored once
    if (typeof v === "string") { return v.charCodeAt(0) === 0 ? strings[+v.slice(1)] : v; }
    if (v && typeof v === "object") {
      Object.keys(v).forEach(function (k) { v[k] = unintern(v[k]); });
    }
    return v;
  }
  data = unintern(data);
  var charts = data.charts || {}, figures = data.figures || {}, tables = data.tables || {};
  var ranks = (data.ranks || []).map(String);
  var each = function (list, fn) { Array.prototype.forEach.call(list, fn); };
  var views = document.querySelectorAll("section.view");
  var names = Array.prototype.map.call(views, function (v) { return v.getAttribute("data-view"); });
  var tabs = document.querySelectorAll("nav.tabs a[data-view]");
  var select = document.getElementById("rank-select");
  var plotly = typeof Plotly !== "undefined";
  if (!plotly) { report("plotly.js did not load: charts are missing"); }
  var state = {view: names[0], rank: "all"};
  var drawn = {}, tableState = {}, tableParams = {}, ready = false;

  function copy(x) { return JSON.parse(JSON.stringify(x)); }

  function figureFor(id, rank) {
    var spec = figures[id] || (charts[id] ? {all: charts[id]} : null);
    if (!spec) { return null; }
    if (rank !== "all" && spec.by_rank && spec.by_rank[rank]) { return copy(spec.by_rank[rank]); }
    if (!spec.all) { return null; }
    var fig = copy(spec.all);
    if (rank !== "all") {
      var ranked = fig.data.filter(function (t) { return t.meta && t.meta.rank !== undefined; });
      fig.data = fig.data.filter(function (t) {
        return !t.meta || t.meta.rank === undefined || String(t.meta.rank) === rank;
      });
      if (ranked.length && !fig.data.length) {
        fig.layout.annotations = [{text: "no data for rank " + rank, showarrow: false,
          xref: "paper", yref: "paper", x: 0.5, y: 0.5}];
      }
    }
    return fig;
  }

  function drawChart(el) {
    if (!plotly) { return null; }
    if (drawn[el.id] === state.rank) { Plotly.Plots.resize(el); return null; }
    var fig = figureFor(el.id, state.rank);
    if (!fig) { return null; }
    drawn[el.id] = state.rank;
    try {
      return Plotly.react(el, fig.data, fig.layout, {displaylogo: false, responsive: true})
        .then(function () {
          el.setAttribute("data-rendered", "1");
          el.setAttribute("data-rank", state.rank);
        })
        .catch(function (err) { report(el.id + ": " + err); });
    } catch (err) { report(el.id + ": " + err); return null; }
  }

  function fmt(value, col) {
    if (value === null || value === undefined) { return col.num ? "n/a" : ""; }
    if (!col.num || typeof value !== "number") { return String(value); }
    return value.toLocaleString("en-US",
      {minimumFractionDigits: col.digits, maximumFractionDigits: col.digits});
  }

  function compare(a, b, num) {
    if (a === b) { return 0; }
    if (a === null || a === undefined || a === "") { return 1; }
    if (b === null || b === undefined || b === "") { return -1; }
    if (num && typeof a === "number" && typeof b === "number") { return a - b; }
    return String(a).localeCompare(String(b));
  }

  function tableSkeleton(el, id, spec) {
    el.textContent = "";  // the static copy of the rows, shown until the table is drawn
    var st = {sort: spec.sort ? spec.sort.slice() : null, filter: "", heads: []};
    var tools = document.createElement("div");
    tools.className = "tools";
    var input = document.createElement("input");
    input.type = "search";
    input.placeholder = "filter rows";
    input.setAttribute("aria-label", "filter rows");
    var count = document.createElement("span");
    count.className = "count";
    tools.appendChild(input);
    tools.appendChild(count);
    var scroll = document.createElement("div");
    scroll.className = "scroll";
    var table = document.createElement("table");
    var head = document.createElement("tr");
    spec.columns.forEach(function (col, i) {
      var th = document.createElement("th");
      th.textContent = col.label;
      if (col.num) { th.className = "num"; }
      th.addEventListener("click", function () {
        var cur = st.sort && st.sort[0] === i ? st.sort[1] : null;
        var first = col.num ? "desc" : "asc", second = col.num ? "asc" : "desc";
        st.sort = cur === null ? [i, first] : cur === first ? [i, second] : null;
        fillTable(el, id);
      });
      st.heads.push(th);
      head.appendChild(th);
    });
    var thead = document.createElement("thead");
    thead.appendChild(head);
    table.appendChild(thead);
    st.body = document.createElement("tbody");
    st.body.addEventListener("click", function (e) {
      var td = e.target.closest ? e.target.closest("td.text") : null;
      if (td) { td.classList.toggle("open"); }
    });
    table.appendChild(st.body);
    scroll.appendChild(table);
    el.appendChild(tools);
    el.appendChild(scroll);
    st.count = count;
    st.input = input;
    st.text = spec.rows.map(function (row) {
      return row.map(function (v, i) { return fmt(v, spec.columns[i]); }).join("\\u0001")
        .toLowerCase();
    });
    input.addEventListener("input", function () {
      st.filter = input.value.toLowerCase();
      fillTable(el, id);
    });
    if (spec.note) {
      var note = document.createElement("p");
      note.className = "note";
      note.textContent = spec.note;
      el.appendChild(note);
    }
    tableState[id] = st;
    return st;
  }

  function fillTable(el, id) {
    var spec = tables[id], st = tableState[id], rc = spec.rank_col;
    var order = [];
    for (var i = 0; i < spec.rows.length; i++) {
      if (rc !== null && rc !== undefined && state.rank !== "all" &&
          String(spec.rows[i][rc]) !== state.rank) { continue; }
      if (st.filter && st.text[i].indexOf(st.filter) < 0) { continue; }
      order.push(i);
    }
    if (st.sort) {
      var c = st.sort[0], sign = st.sort[1] === "desc" ? -1 : 1, num = spec.columns[c].num;
      order.sort(function (a, b) {
        var va = spec.rows[a][c], vb = spec.rows[b][c];
        var blank = function (v) { return v === null || v === undefined || v === ""; };
        if (blank(va) || blank(vb)) { return compare(va, vb, num) || a - b; }
        return sign * compare(va, vb, num) || a - b;
      });
    }
    st.heads.forEach(function (th, i) {
      if (st.sort && st.sort[0] === i) {
        th.setAttribute("aria-sort", st.sort[1] === "desc" ? "descending" : "ascending");
      } else { th.removeAttribute("aria-sort"); }
    });
    var frag = document.createDocumentFragment();
    order.slice(0, MAX_ROWS).forEach(function (r) {
      var tr = document.createElement("tr");
      spec.rows[r].forEach(function (v, i) {
        var td = document.createElement("td"), col = spec.columns[i];
        var text = fmt(v, col);
        if (spec.depth && i === 1 && spec.depth[r] > 0) {
          text = "\\u2514 " + text;
          td.style.paddingLeft = (0.6 + 1.2 * spec.depth[r]) + "em";
        }
        td.textContent = text;
        if (col.num) {
          td.className = v === null ? "num na" : "num";
        } else {
          td.className = "text";  // one line, cut with an ellipsis: hover shows it, click opens
          td.title = text;
        }
        tr.appendChild(td);
      });
      frag.appendChild(tr);
    });
    if (!order.length) {
      var tr = document.createElement("tr"), td = document.createElement("td");
      td.colSpan = spec.columns.length;
      td.className = "na";
      td.textContent = spec.rows.length ? "no matching rows" : "no rows";
      tr.appendChild(td);
      frag.appendChild(tr);
    }
    st.body.textContent = "";
    st.body.appendChild(frag);
    var total = order.length;
    st.count.textContent = total > MAX_ROWS
      ? "showing " + MAX_ROWS + " of " + total + " rows: filter or sort to see others"
      : total + (total === 1 ? " row" : " rows");
    el.setAttribute("data-rows", String(Math.min(total, MAX_ROWS)));
    el.setAttribute("data-rank", state.rank);
  }

  function takeParams(id) {
    // #view=kernels&table=kernels-table&sort=3&dir=asc&filter=gemm: a link to a table's state
    var p = tableParams[id], st = tableState[id];
    if (!p) { return; }
    delete tableParams[id];
    var col = parseInt(p.sort, 10);
    if (col >= 0 && col < tables[id].columns.length) {
      st.sort = [col, p.dir === "asc" ? "asc" : "desc"];
    }
    if (p.filter !== undefined) {
      st.input.value = p.filter;
      st.filter = p.filter.toLowerCase();
    }
  }

  function drawTable(el) {
    var id = el.getAttribute("data-table");
    if (el.hidden || !tables[id]) { return; }
    if (!tableState[id]) { tableSkeleton(el, id, tables[id]); }
    else if (drawn["table:" + id] === state.rank && !tableParams[id]) { return; }
    takeParams(id);
    drawn["table:" + id] = state.rank;
    try { fillTable(el, id); } catch (err) { report(id + ": " + err); }
  }

  function show() {
    each(views, function (v) { v.hidden = v.getAttribute("data-view") !== state.view; });
    each(tabs, function (a) {
      var on = a.getAttribute("data-view") === state.view;
      a.classList.toggle("active", on);
      a.setAttribute("aria-selected", on ? "true" : "false");
    });
    if (select) { select.value = state.rank; }
    var view = document.getElementById("view-" + state.view);
    if (!view) { return; }
    view.removeAttribute("data-view-rendered");
    var pending = [];
    each(view.querySelectorAll(".chart"), function (el) {
      var p = drawChart(el);
      if (p) { pending.push(p); }
    });
    each(view.querySelectorAll(".vtable"), drawTable);
    var rank = state.rank;
    Promise.all(pending).then(function () {
      view.setAttribute("data-view-rendered", "1");
      view.setAttribute("data-rank", rank);
      if (!ready) {
        ready = true;
        var root = document.documentElement;
        root.setAttribute("data-ready-ms", performance.now().toFixed(0));
        root.setAttribute("data-script-ms", started.toFixed(0));
      }
    });
  }

  function setHash() {
    var hash = "#view=" + state.view + (state.rank !== "all" ? "&rank=" + state.rank : "");
    try { history.replaceState(null, "", hash); } catch (err) { /* file: URLs may refuse */ }
    show();
  }

  function decode(text) {
    try { return decodeURIComponent(text); } catch (err) { return text; }
  }

  function apply() {
    var raw = location.hash.replace(/^#/, ""), params = {}, target = null;
    raw.split("&").forEach(function (kv) {
      var i = kv.indexOf("=");
      if (i > 0) { params[kv.slice(0, i)] = decode(kv.slice(i + 1)); }
    });
    raw = decode(raw);
    if (params.view !== undefined || params.rank !== undefined) {
      if (names.indexOf(params.view) >= 0) { state.view = params.view; }
      if (params.rank === "all" || ranks.indexOf(params.rank) >= 0) { state.rank = params.rank; }
      if (params.table && tables[params.table]) { tableParams[params.table] = params; }
    } else if (raw) {
      target = document.getElementById(raw);
      var holder = target && target.closest("section.view");
      if (holder) { state.view = holder.getAttribute("data-view"); }
    }
    show();
    if (target) { target.scrollIntoView(); }
  }

  each(tabs, function (a) {
    a.addEventListener("click", function (e) {
      e.preventDefault();
      state.view = a.getAttribute("data-view");
      setHash();
    });
  });
  if (select) {
    select.addEventListener("change", function () { state.rank = select.value; setHash(); });
  }
  each(document.querySelectorAll("select[data-switch]"), function (sw) {
    sw.addEventListener("change", function () {
      var group = sw.getAttribute("data-switch");
      each(document.querySelectorAll('.vtable[data-group="' + group + '"]'), function (el) {
        el.hidden = el.getAttribute("data-table") !== sw.value;
        drawTable(el);
      });
    });
  });
  window.addEventListener("hashchange", apply);
  apply();
})();
""".replace("__MAX_ROWS__", str(MAX_TABLE_ROWS))
