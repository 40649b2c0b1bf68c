// Offline pages (mlsys-lab export): run explorer.js on each saved state, with a stand-in for
// the widget model.
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
    document.querySelectorAll("div.mlsys-explorer-offline").forEach(function (div) {
      var state = JSON.parse(div.querySelector("script[type='application/json']").textContent);
      var host = document.createElement("div");
      div.innerHTML = "";
      div.appendChild(host);
      window.__mlsysExplorer.render({ model: standIn(state), el: host });
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();
