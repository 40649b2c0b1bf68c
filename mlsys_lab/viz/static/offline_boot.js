// Offline pages (mlsys-lab export): run explorer.js / timeline.js on each saved state, with a
// stand-in for the widget model.
(function () {
  function standIn(state) {
    var handlers = {};
    return {
      get: function (k) { return state[k]; },
      set: function (k, v) { state[k] = v; (handlers["change:" + k] || []).forEach(function (f) { f(); }); },
      save_changes: function () {},
      on: function (ev, f) { (handlers[ev] = handlers[ev] || []).push(f); },
      off: function () {}
    };
  }
  function boot() {
    [["div.mlsys-explorer-offline", window.__mlsysExplorer],
     ["div.mlsys-timeline-offline", window.__mlsysTimeline]].forEach(function (pair) {
      document.querySelectorAll(pair[0]).forEach(function (div) {
        var state = JSON.parse(div.querySelector("script[type='application/json']").textContent);
        var host = document.createElement("div");
        div.innerHTML = "";
        div.appendChild(host);
        pair[1].render({ model: standIn(state), el: host });
      });
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();
