// mlsys-lab timeline view (anywidget front end; no dependencies, no network).
// The model's data comes from mlsys_lab.viz.timeline_view (timeline_model and its builders):
// lanes (devices, stages, ranks), optional sub-lanes, and bars
// [lane, sub, start, end, style, label, info, key], which arrive packed column-wise (pack_model:
// integer columns in strings with runs as v*n, times in ticks, start as differences and end as a
// length, labels/infos as indices into tables) and are unpacked here. The same code runs in JupyterLab
// (model = the anywidget model) and in the offline HTML export (a stand-in model over the saved
// state).
// Hover a bar: its op/message. Click a bar: select it (and put the time cursor on it). Click the
// background: move the time cursor; the bars running then are outlined. Wheel: zoom in time;
// drag: pan; double-click: the whole run. The controls take the keyboard (arrow keys move a
// slider): their key events stop at the view, so JupyterLab's notebook shortcuts (arrows move to
// another cell) never see them, and the focused control keeps the focus when the view is rebuilt.

const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs = {}, parent = null, ns = SVG) {
  const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function fmt(x) {
  const a = Math.abs(x);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? x.toExponential(2) : String(+x.toPrecision(4));
}

// The bars of a model packed by mlsys_lab.viz.timeline_view.pack_model, as a list again.
function unpack(data) {
  const p = data.bars;
  if (Array.isArray(p)) return data;
  const col = (s) => {
    const v = [];
    for (const token of s.trim() ? s.trim().split(/\s+/) : []) {   // "v*n": n times v
      const [value, count] = token.split("*");
      for (let k = 0; k < (count === undefined ? 1 : +count); k++) v.push(+value);
    }
    if (v.length !== p.count) throw new Error(`timeline: a column holds ${v.length} of ${p.count}`);
    return v;
  };
  const [lane, sub, start, length, style, label, info] =
    ["lane", "sub", "start", "length", "style", "label", "info"].map((k) => col(p[k]));
  for (let i = 1; i < start.length; i++) start[i] += start[i - 1];   // stored as differences
  const bars = lane.map((_, i) => [lane[i], sub[i], data.t0 + start[i] * p.tick,
    data.t0 + (start[i] + length[i]) * p.tick, style[i], p.labels[label[i]], p.infos[info[i]],
    p.keys ? p.keys[i] : String(i)]);
  return Object.assign({}, data, { bars });
}

// Key presses in the view's controls are theirs: stop them before they bubble up to the page's
// shortcut handler (JupyterLab's, in the bubbling phase), as ipywidgets' own controls do.
function keepKeys(root) {
  for (const type of ["keydown", "keypress", "keyup"]) {
    root.addEventListener(type, (ev) => {
      if (ev.target.closest && ev.target.closest("input, select, textarea")) ev.stopPropagation();
    });
  }
}

function render({ model, el: root }) {
  root.classList.add("mlsys-timeline");
  keepKeys(root);
  let hovered = "";

  function draw() {
    const data = unpack(model.get("model"));
    const offline = !!model.get("offline");
    // the control that has the focus gets it back once the view is rebuilt from its new value
    const active = document.activeElement;
    const focused = active && root.contains(active) && active.name ? active.name : null;
    root.innerHTML = "";
    const bar = el("div", { class: "tl-bar" }, root, null);
    el("span", { class: "tl-title" }, bar, null).textContent = data.title;
    const params = Object.assign({}, model.get("params") || {});
    let refocus = null;
    for (const c of data.controls || []) {
      const label = el("label", { class: "tl-control" }, bar, null);
      label.append(c.label + " ");
      const input = c.type === "bool"
        ? el("input", { type: "checkbox", name: c.name, class: "tl-input" }, label, null)
        : el("input", { type: "range", name: c.name, min: c.min, max: c.max, step: 1,
          value: c.value, class: "tl-input" }, label, null);
      if (c.type === "bool") input.checked = !!c.value;
      const shown = c.type === "bool" ? null : el("span", { class: "tl-value" }, label, null);
      if (shown) shown.textContent = c.value;
      if (offline) {
        input.disabled = true;
        label.title = "changing this needs a running kernel";
      }
      input.addEventListener("input", () => { if (shown) shown.textContent = input.value; });
      if (c.name === focused) refocus = input;
      input.addEventListener("change", () => {
        params[c.name] = c.type === "bool" ? input.checked : parseInt(input.value, 10);
        model.set("params", Object.assign({}, params));
        model.save_changes();
      });
    }
    if (refocus) refocus.focus({ preventScroll: true });
    if (data.caption) el("div", { class: "tl-caption" }, root, null).textContent = data.caption;
    if ((data.styles || []).length && data.styles.length <= 10) {
      const legend = el("div", { class: "tl-legend" }, root, null);
      for (const s of data.styles) {
        const item = el("span", { class: "tl-key" }, legend, null);
        el("span", { class: "tl-swatch" }, item, null).style.background = s.color;
        item.append(s.name);
      }
    }

    // ------------------------------------------------------------------ layout
    const subs = Math.max((data.subs || []).length, 1);
    // many rows of sub-lanes get thinner sub-lanes: a 32-rank trace fits the view without scrolling
    const rows = data.lanes.length;
    const pitch = subs > 1 && rows > 12 ? (rows > 24 ? 4 : 5) : 7, pad = pitch === 7 ? 3 : 2;
    const laneH = subs > 1 ? pitch * subs + 2 * pad : 22, headH = 18, L = 120, R = 12, W = 900, axisH = 30;
    const groups = data.groups || [];
    const headOf = new Map(groups.map((g) => [g.first, g]));
    // a lane as the readout names it: with its group's short name (up to a colon) when the
    // groups repeat lane names (compared runs, schedules)
    const laneName = data.lanes.map((name, i) => {
      const g = groups.find((x) => x.first <= i && i < x.first + x.count);
      return g ? `${g.title.split(":")[0]} ${name}` : name;
    });
    const laneY = [];
    let y = 6;
    data.lanes.forEach((_, i) => {
      if (headOf.has(i)) y += headH;
      laneY.push(y);
      y += laneH;
    });
    const H = y + axisH;
    const scroll = el("div", { class: "tl-scroll" }, root, null);
    const svg = el("svg", { class: "tl-svg", viewBox: `0 0 ${W} ${H}`, width: "100%" }, scroll);
    svg.style.aspectRatio = `${W} / ${H}`;
    const full = [data.t0, data.t1 > data.t0 ? data.t1 : data.t0 + 1e-9];
    let view = full.slice();
    const sx = (t) => L + ((t - view[0]) / (view[1] - view[0])) * (W - L - R);
    const tOf = (px) => view[0] + ((px - L) / (W - L - R)) * (view[1] - view[0]);
    const clip = el("clipPath", { id: "tl-clip-" + Math.random().toString(36).slice(2) },
      el("defs", {}, svg));
    el("rect", { x: L, y: 0, width: W - L - R, height: H }, clip);
    const bg = el("rect", { x: L, y: 0, width: W - L - R, height: H - axisH, class: "tl-bg" }, svg);
    for (const g of groups) {
      el("text", { x: 4, y: laneY[g.first] - 5, class: "tl-group" }, svg).textContent = g.title;
    }
    data.lanes.forEach((name, i) => {
      el("text", { x: L - 6, y: laneY[i] + laneH / 2 + 4, "text-anchor": "end",
        class: "tl-lane" }, svg).textContent = name;
      el("line", { x1: L, x2: W - R, y1: laneY[i] + laneH, y2: laneY[i] + laneH,
        class: "tl-grid" }, svg);
    });
    const plot = el("g", { "clip-path": `url(#${clip.id})` }, svg);
    const axis = el("g", {}, svg);
    const styles = data.styles || [];
    const bars = data.bars.map((b) => {
      const [lane, sub, start, end, style, label, given, key] = b;
      const info = given || `${label} on ${laneName[lane]}, ${fmt((start - data.t0) / data.scale)}-` +
        `${fmt((end - data.t0) / data.scale)} ${data.unit}`;
      const top = laneY[lane] + (subs > 1 ? pad + sub * pitch : 3);
      const h = subs > 1 ? pitch - 1 : laneH - 6;
      const s = styles[style] || { color: "#999" };
      const rect = el("rect", { y: top, height: h, fill: s.color, class: "tl-item",
        "data-key": key }, plot);
      el("title", {}, rect).textContent = info;
      const text = label && subs === 1
        ? el("text", { y: top + h / 2 + 4, "text-anchor": "middle", class: "tl-label" }, plot)
        : null;
      if (text) text.textContent = label;
      rect.addEventListener("mouseenter", () => { hovered = key; showInfo(); mark(); });
      rect.addEventListener("mouseleave", () => { hovered = ""; showInfo(); mark(); });
      rect.addEventListener("click", (ev) => {
        ev.stopPropagation();
        model.set("selected", key);
        model.set("cursor", (start + end) / 2);
        model.save_changes();
      });
      return { lane, start, end, label, info, key, rect, text };
    });
    const byKey = new Map(bars.map((b) => [b.key, b]));
    const cursor = el("line", { y1: 0, y2: H - axisH, class: "tl-cursor" }, svg);
    const info = el("div", { class: "tl-info" }, root, null);

    function place() {
      for (const b of bars) {
        const x0 = sx(b.start), x1 = sx(b.end);
        b.rect.setAttribute("x", x0);
        b.rect.setAttribute("width", Math.max(x1 - x0, 0.6));
        if (b.text) {
          b.text.setAttribute("x", (x0 + x1) / 2);
          b.text.style.display = x1 - x0 > 7 * b.label.length + 4 ? "" : "none";
        }
      }
      axis.innerHTML = "";
      el("line", { x1: L, x2: W - R, y1: H - axisH, y2: H - axisH, class: "tl-axis" }, axis);
      const span = view[1] - view[0];
      const raw = span / 8, mag = Math.pow(10, Math.floor(Math.log10(raw)));
      const step = [1, 2, 5, 10].map((k) => k * mag).find((s) => s >= raw);
      // ticks at round times from t0 (a schedule's clock starts far from zero)
      for (let t = data.t0 + Math.ceil((view[0] - data.t0) / step - 1e-9) * step;
        t <= view[1] + 1e-9 * span; t += step) {
        const x = sx(t);
        el("line", { x1: x, x2: x, y1: H - axisH, y2: H - axisH + 4, class: "tl-axis" }, axis);
        el("text", { x, y: H - axisH + 15, "text-anchor": "middle", class: "tl-tick" }, axis)
          .textContent = fmt((t - data.t0) / data.scale);
      }
      el("text", { x: (L + W) / 2, y: H - 3, "text-anchor": "middle", class: "tl-tick" }, axis)
        .textContent = data.x_label || `time (${data.unit})`;
      mark();
    }

    function at(t) { return bars.filter((b) => b.start <= t && t <= b.end); }

    function showInfo() {
      const sel = byKey.get(model.get("selected"));
      const c = model.get("cursor");
      if (hovered) { info.textContent = byKey.get(hovered).info; return; }
      const parts = [];
      if (sel) parts.push("selected: " + sel.info);
      if (c >= 0) {
        const now = at(c);
        parts.push(`t = ${fmt((c - data.t0) / data.scale)} ${data.unit}: ${now.length} running` +
          (now.length ? " (" + now.slice(0, 6).map((b) => laneName[b.lane] + " " +
            (b.label || b.info)).join(", ") + (now.length > 6 ? ", …" : "") + ")"
            : ""));
      }
      info.textContent = parts.length ? parts.join("  ·  ")
        : "hover a bar to name it; click a bar or the background for the time cursor";
    }

    function mark() {
      const sel = model.get("selected"), c = model.get("cursor");
      for (const b of bars) {
        b.rect.classList.toggle("tl-selected", b.key === sel);
        b.rect.classList.toggle("tl-hovered", b.key === hovered);
        b.rect.classList.toggle("tl-at", c >= 0 && b.start <= c && c <= b.end);
      }
      const x = sx(c);
      cursor.style.display = c >= 0 && x >= L && x <= W - R ? "" : "none";
      cursor.setAttribute("x1", x);
      cursor.setAttribute("x2", x);
      root.setAttribute("data-selected", sel);
      root.setAttribute("data-cursor", c);
      root.setAttribute("data-hovered", hovered);
      root.setAttribute("data-at-cursor", c >= 0 ? at(c).length : 0);
    }

    const svgX = (ev) => {
      const r = svg.getBoundingClientRect();
      return ((ev.clientX - r.left) / r.width) * W;
    };
    let drag = null, moved = false;
    svg.addEventListener("wheel", (ev) => {
      const x = svgX(ev);
      if (x < L) return;
      ev.preventDefault();
      const t = tOf(x), k = ev.deltaY > 0 ? 1.25 : 1 / 1.25;
      const width = Math.min((view[1] - view[0]) * k, full[1] - full[0]);
      let v0 = t - (t - view[0]) * (width / (view[1] - view[0]));
      v0 = Math.max(full[0], Math.min(v0, full[1] - width));
      view = [v0, v0 + width];
      place();
    }, { passive: false });
    svg.addEventListener("pointerdown", (ev) => { drag = { x: svgX(ev), v: view.slice() }; moved = false; });
    svg.addEventListener("pointermove", (ev) => {
      if (!drag) return;
      const dx = svgX(ev) - drag.x;
      if (Math.abs(dx) < 3 && !moved) return;
      moved = true;
      const dt = (dx / (W - L - R)) * (drag.v[1] - drag.v[0]), width = drag.v[1] - drag.v[0];
      const v0 = Math.max(full[0], Math.min(drag.v[0] - dt, full[1] - width));
      view = [v0, v0 + width];
      place();
    });
    window.addEventListener("pointerup", () => { drag = null; });
    svg.addEventListener("dblclick", () => { view = full.slice(); place(); });
    bg.addEventListener("click", (ev) => {
      if (moved) return;
      model.set("cursor", tOf(svgX(ev)));
      model.set("selected", "");
      model.save_changes();
    });

    place();
    showInfo();
    root._tlRefresh = () => { mark(); showInfo(); };
    root.setAttribute("data-bars", bars.length);
    root.setAttribute("data-ready", "1");
  }

  model.on("change:model", draw);
  model.on("change:selected", () => root._tlRefresh && root._tlRefresh());
  model.on("change:cursor", () => root._tlRefresh && root._tlRefresh());
  draw();
}

export default { render };
