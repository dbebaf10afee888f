// A JupyterLab extension written by hand: a module-federation container (JupyterLab calls init(), then
// get("./extension")) whose one plugin needs nothing from JupyterLab's shared modules, so nothing is built.
// make lab and Binder load it from binder/jupyter/labextensions (binder/jupyter/jupyter_server_config.py).
//
// nbgrader's Validate button runs the whole notebook in a fresh kernel and blocks until it is done, with
// its label set to "Validating...". While it runs, the label counts the seconds and the button carries a
// moving stripe; and Validate's dialog wraps long lines, so a check's hint is shown whole.
var _JUPYTERLAB;
(function () {
  "use strict";
  var STYLE = [
    "#validation-message pre { white-space: pre-wrap; overflow-wrap: anywhere; }",
    ".validate-button.tdd-validating {",
    "  background-image: repeating-linear-gradient(-45deg, var(--jp-brand-color3, #bbdefb) 0 8px,",
    "                                              transparent 8px 16px);",
    "  background-size: 200% 100%; animation: tdd-validating 2s linear infinite;",
    "}",
    "@keyframes tdd-validating { from { background-position: 0 0; } to { background-position: -45px 0; } }"
  ].join("\n");
  var HINT = "Validate runs your notebook top to bottom in a fresh kernel, as the grader does (training cells short); " +
    "the seconds it has run are counted here";

  function tick(started) {
    var labels = document.querySelectorAll(".validate-button .jp-ToolbarButtonComponent-label");
    for (var i = 0; i < labels.length; i++) {
      var label = labels[i];
      var button = label.closest(".validate-button");
      var text = label.textContent || "";
      if (text.indexOf("Validating") === 0) {
        if (!started.has(label)) {
          started.set(label, Date.now());
        }
        var seconds = Math.floor((Date.now() - started.get(label)) / 1000);
        label.textContent = "Validating… " + seconds + " s";
        button.classList.add("tdd-validating");
        button.setAttribute("title", HINT);
      } else if (started.has(label)) {
        started.delete(label);
        button.classList.remove("tdd-validating");
      }
    }
  }

  var plugin = {
    id: "tdd-course:validate-progress",
    description: "nbgrader's Validate: the seconds it has run on its button, whole hints in its dialog.",
    autoStart: true,
    activate: function () {
      var style = document.createElement("style");
      style.id = "tdd-course-style";
      style.textContent = STYLE;
      document.head.appendChild(style);
      var started = new Map();
      window.setInterval(function () { tick(started); }, 500);
    }
  };

  var modules = {
    "./extension": function () { return { __esModule: true, default: [plugin] }; }
  };
  _JUPYTERLAB = _JUPYTERLAB || {};
  _JUPYTERLAB["tdd-course"] = {
    init: function () {},
    get: function (name) {
      return name in modules ? Promise.resolve(modules[name])
        : Promise.reject(new Error("tdd-course has no module " + name));
    }
  };
})();
