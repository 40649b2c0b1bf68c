// mlsys-lab linked graph + memory explorer (anywidget front end; no dependencies, no network).
// The model's data comes from mlsys_lab.viz.explorer_view.explorer_model. The same code runs in
// JupyterLab (model = the anywidget model) and in the offline HTML export (a small stand-in
// model over the saved state), so everything interactive is computed here.

const SVG = "http://www.w3.org/2000/svg";
const PHASE_FILL = { forward: "#dbe9fb", backward: "#eadcf7" };
const ROLE_FILL = { input: "#add8e6", output: "#f0e68c", const: "#d3d3d3", intermediate: "#ffffff" };
const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
  "#ff9da7", "#9c755f", "#bab0ac"];

function el(tag, attrs = {}, parent = null, ns = SVG) {
  const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function fmtBytes(n) {
  return n.toLocaleString("en-US") + " B";
}

function render({ model, el: root }) {
  const data = model.get("model");
  const panes = model.get("panes") || "both";
  const byKey = new Map(data.nodes.map((n) => [n.key, n]));
  const ops = data.schedule.map((k) => byKey.get(k));
  let hovered = "";

  root.classList.add("mlsys-explorer");
  root.innerHTML = "";
  // Key presses in the slider and the planner picker are theirs (arrow keys move the step): stop
  // them before they bubble up to JupyterLab's notebook shortcuts, as ipywidgets' controls do.
  for (const type of ["keydown", "keypress", "keyup"]) {
    root.addEventListener(type, (ev) => {
      if (ev.target.closest && ev.target.closest("input, select, textarea")) ev.stopPropagation();
    });
  }
  const bar = el("div", { class: "mx-bar" }, root, null);
  el("span", { class: "mx-title" }, bar, null).textContent = data.title;
  const slider = el("input", { type: "range", min: 0, max: Math.max(ops.length - 1, 0),
    value: model.get("step"), class: "mx-step" }, bar, null);
  const stepLabel = el("span", { class: "mx-step-label" }, bar, null);
  let picker = null;
  if (panes !== "graph") {
    picker = el("select", { class: "mx-planner" }, bar, null);
    for (const name of Object.keys(data.memory.planners)) {
      const opt = el("option", { value: name }, picker, null);
      opt.textContent = name;
    }
    picker.value = model.get("planner");
  }
  const body = el("div", { class: "mx-body mx-panes-" + panes }, root, null);
  const info = el("div", { class: "mx-info" }, root, null);

  // ---------------------------------------------------------------------------- graph pane
  let graphSvg = null, view = null, shapes = new Map(), edgeEls = [];
  if (panes !== "memory") {
    const xs = data.nodes.flatMap((n) => [n.x - n.w / 2, n.x + n.w / 2]);
    const ys = data.nodes.flatMap((n) => [n.y - n.h / 2, n.y + n.h / 2]);
    const box = [Math.min(...xs) - 10, Math.min(...ys) - 10,
      Math.max(...xs) - Math.min(...xs) + 20, Math.max(...ys) - Math.min(...ys) + 20];
    // Fill the pane's width (labels stay readable); a tall graph is panned, not shrunk.
    graphSvg = el("svg", { class: "mx-graph", viewBox: box.join(" "),
      preserveAspectRatio: "xMidYMin slice" }, body);
    view = { x: box[0], y: box[1], w: box[2], h: box[3] };
    const defs = el("defs", {}, graphSvg);
    const marker = el("marker", { id: "mx-arrow", viewBox: "0 0 10 10", refX: 9, refY: 5,
      markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" }, defs);
    el("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#777" }, marker);
    const edgeLayer = el("g", {}, graphSvg);
    for (const [a, b] of data.edges) {
      const p = byKey.get(a), q = byKey.get(b);
      const line = el("line", { x1: p.x, y1: p.y + (q.y >= p.y ? p.h / 2 : 0), x2: q.x,
        y2: q.y - (q.y >= p.y ? q.h / 2 : 0), class: "mx-edge", "marker-end": "url(#mx-arrow)" },
        edgeLayer);
      edgeEls.push({ a, b, line });
    }
    for (const n of data.nodes) {
      const g = el("g", { class: "mx-node mx-" + n.kind, "data-key": n.key }, graphSvg);
      const shape = n.kind === "op"
        ? el("rect", { x: n.x - n.w / 2, y: n.y - n.h / 2, width: n.w, height: n.h, rx: 6 }, g)
        : el("ellipse", { cx: n.x, cy: n.y, rx: n.w / 2, ry: n.h / 2 }, g);
      const lines = n.label.split("\n");
      lines.forEach((t, i) => {
        const text = el("text", { x: n.x, y: n.y + (i - (lines.length - 1) / 2) * 12 + 4,
          "text-anchor": "middle" }, g);
        text.textContent = t;
      });
      el("title", {}, g).textContent = n.kind === "op" ? `${n.name} (step ${n.step}, ${n.phase})`
        : n.name;
      g.addEventListener("click", (ev) => {
        ev.stopPropagation();
        model.set("selected", n.key);
        if (n.kind === "op") model.set("step", n.step);
        model.save_changes();
      });
      shapes.set(n.key, { g, shape, n });
    }
    // Pan (drag) and zoom (wheel) by moving the viewBox.
    const apply = () => graphSvg.setAttribute("viewBox", `${view.x} ${view.y} ${view.w} ${view.h}`);
    graphSvg.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      const r = graphSvg.getBoundingClientRect();
      const fx = (ev.clientX - r.left) / r.width, fy = (ev.clientY - r.top) / r.height;
      const k = ev.deltaY > 0 ? 1.15 : 1 / 1.15;
      const nw = view.w * k, nh = view.h * k;
      view.x += (view.w - nw) * fx; view.y += (view.h - nh) * fy; view.w = nw; view.h = nh;
      apply();
    }, { passive: false });
    let drag = null;
    graphSvg.addEventListener("pointerdown", (ev) => {
      drag = { x: ev.clientX, y: ev.clientY, vx: view.x, vy: view.y };
    });
    window.addEventListener("pointerup", () => { drag = null; });
    graphSvg.addEventListener("pointermove", (ev) => {
      if (!drag) return;
      const r = graphSvg.getBoundingClientRect();
      view.x = drag.vx - (ev.clientX - drag.x) * view.w / r.width;
      view.y = drag.vy - (ev.clientY - drag.y) * view.h / r.height;
      apply();
    });
  }

  // ---------------------------------------------------------------------------- memory pane
  let memSvg = null, rectEls = [], cursor = null;
  const W = 640, H = 360, L = 70, B = 28;
  function drawMemory() {
    if (panes === "graph") return;
    if (memSvg) memSvg.remove();
    memSvg = el("svg", { class: "mx-memory", viewBox: `0 0 ${W} ${H}` }, body);
    const plan = data.memory.planners[model.get("planner")];
    const top = Math.max(plan.arena, data.memory.lower_bound, 1) * 1.1;
    const steps = Math.max(data.memory.steps, 1);
    const sx = (t) => L + (t / steps) * (W - L - 10);
    const sy = (a) => H - B - (a / top) * (H - B - 10);
    el("line", { x1: L, y1: H - B, x2: W - 10, y2: H - B, class: "mx-axis" }, memSvg);
    el("line", { x1: L, y1: 10, x2: L, y2: H - B, class: "mx-axis" }, memSvg);
    el("text", { x: (W + L) / 2, y: H - 6, "text-anchor": "middle" }, memSvg).textContent = "step";
    el("text", { x: 4, y: sy(plan.arena) + 4 }, memSvg).textContent = fmtBytes(plan.arena);
    rectEls = plan.rects.map((r, i) => {
      const rect = el("rect", { x: sx(r.start), y: sy(r.offset + r.size),
        width: Math.max(sx(r.end + 1) - sx(r.start), 1), height: Math.max(sy(r.offset) - sy(r.offset + r.size), 1),
        fill: PALETTE[i % PALETTE.length], class: "mx-rect", "data-key": r.key }, memSvg);
      rect.addEventListener("mouseenter", () => { hovered = r.key; showRect(r); update(); });
      rect.addEventListener("mouseleave", () => { hovered = ""; update(); });
      rect.addEventListener("click", () => { model.set("selected", r.key); model.save_changes(); });
      return { r, rect };
    });
    el("line", { x1: L, y1: sy(plan.arena), x2: W - 10, y2: sy(plan.arena), class: "mx-arena" }, memSvg);
    el("line", { x1: L, y1: sy(data.memory.lower_bound), x2: W - 10,
      y2: sy(data.memory.lower_bound), class: "mx-bound" }, memSvg);
    cursor = el("rect", { y: 10, height: H - B - 10, class: "mx-cursor" }, memSvg);
    cursor.sx = sx;
  }
  function showRect(r) {
    info.textContent = `${r.name}: ${fmtBytes(r.size)} at offset ${fmtBytes(r.offset)}, ` +
      `steps ${r.start}-${r.end}; produced by ${r.producer || "(graph input)"}, last read by ${r.reader}`;
  }

  // ---------------------------------------------------------------------------- state -> picture
  function update() {
    const step = Math.min(model.get("step"), Math.max(ops.length - 1, 0));
    const op = ops[step];
    const live = new Set(data.live[step] || []);
    const sel = model.get("selected");
    const selNode = byKey.get(sel);
    const focus = selNode && selNode.kind === "op" ? selNode : op;
    const inputs = new Set(focus ? [...focus.inputs, ...focus.values_in] : []);
    const users = new Set(focus ? focus.users : []);
    slider.value = step;
    stepLabel.textContent = op ? `step ${step}: ${op.name}  ·  ${live.size} live` : "";
    for (const { shape, n, g } of shapes.values()) {
      let fill = n.kind === "op" ? PHASE_FILL[n.phase] || "#fff" : ROLE_FILL[n.role] || "#fff";
      if (n.kind === "value" && live.has(n.key)) fill = "#98fb98";
      if (op && n.key === op.key) fill = "#ffa500";
      shape.setAttribute("fill", fill);
      g.classList.toggle("mx-live", n.kind === "value" && live.has(n.key));
      g.classList.toggle("mx-current", !!op && n.key === op.key);
      g.classList.toggle("mx-selected", n.key === sel);
      g.classList.toggle("mx-input", inputs.has(n.key));
      g.classList.toggle("mx-user", users.has(n.key));
      g.classList.toggle("mx-hovered", n.key === hovered);
    }
    for (const { a, b, line } of edgeEls) {
      line.classList.toggle("mx-edge-in", !!focus && (b === focus.key));
      line.classList.toggle("mx-edge-out", !!focus && (a === focus.key ||
        (focus.values_out || []).includes(a)));
    }
    for (const { r, rect } of rectEls) {
      rect.classList.toggle("mx-rect-live", r.start <= step && step <= r.end);
      rect.classList.toggle("mx-rect-selected", r.key === sel || r.key === hovered);
    }
    if (cursor) {
      cursor.setAttribute("x", cursor.sx(step));
      cursor.setAttribute("width", Math.max(cursor.sx(step + 1) - cursor.sx(step), 1));
    }
    if (!hovered) {
      info.textContent = selNode ? (selNode.kind === "op"
        ? `${selNode.name}: inputs ${selNode.values_in.length}, users ${selNode.users.length}, ${selNode.phase}`
        : `${selNode.name} (${selNode.role})`) : "click a node; hover a rectangle";
    }
    root.setAttribute("data-step", step);
    root.setAttribute("data-selected", sel);
    root.setAttribute("data-planner", model.get("planner"));
  }

  slider.addEventListener("input", () => {
    model.set("step", parseInt(slider.value, 10));
    model.save_changes();
  });
  if (picker) picker.addEventListener("change", () => {
    model.set("planner", picker.value);
    model.save_changes();
  });
  model.on("change:step", update);
  model.on("change:selected", update);
  model.on("change:planner", () => { if (picker) picker.value = model.get("planner"); drawMemory(); update(); });
  drawMemory();
  update();
  root.setAttribute("data-ready", "1");
}

export default { render };
