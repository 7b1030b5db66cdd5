// dsportal's JupyterLab extension, written as a plain module-federation container (no build step):
// JupyterLab loads this file, calls init(shareScope), then get("./extension") for the plugin.
// - "Open TensorBoard" in the file browser's context menu, for a folder or the current folder;
// - "Multi-node jobs" and "TensorBoard (this folder)" in the launcher and the command palette;
// - opening a file under templates/ opens the user's own copy instead (made on first open, never
//   overwritten), with a note when the template changed since, and an offer of a fresh copy;
// - a warning before the hub stops a session nobody uses (idle limit), with "Keep my session".
var _JUPYTERLAB;
(function () {
  "use strict";
  var shareScope = null;

  function config() {
    var node = document.getElementById("jupyter-config-data");
    return node ? JSON.parse(node.textContent) : {};
  }
  function baseUrl() {
    var base = config().baseUrl || "/";
    return base.endsWith("/") ? base : base + "/";
  }
  function shared(name, exported) {
    // A token (e.g. ILauncher) from JupyterLab's own copy of a package, if it shares one.
    var versions = shareScope && shareScope[name];
    if (!versions) return Promise.resolve(null);
    var keys = Object.keys(versions);
    if (!keys.length) return Promise.resolve(null);
    var loaded = keys.filter(function (key) { return versions[key].loaded; });
    var key = loaded.length ? loaded[0] : keys[keys.length - 1];
    return versions[key].get().then(function (factory) {
      var module = factory();
      return (module && module[exported]) || null;
    }).catch(function () { return null; });
  }
  function fileBrowser(app) {
    var found = null;
    var widgets = app.shell.widgets("left");
    var next = widgets.next();
    while (!next.done) {
      var widget = next.value;
      if (widget && widget.id === "filebrowser") { found = widget; break; }
      next = widgets.next();
    }
    return found;
  }
  function selectedFolder(app) {
    var browser = fileBrowser(app);
    if (!browser) return "";
    var items = browser.selectedItems ? browser.selectedItems() : null;
    if (items) {
      var item = items.next();
      if (!item.done && item.value && item.value.type === "directory") return item.value.path;
    }
    return browser.model ? browser.model.path : "";
  }
  function currentFolder(app) {
    var browser = fileBrowser(app);
    return browser && browser.model ? browser.model.path : "";
  }
  function xsrf() {
    var match = document.cookie.match(/(?:^|;\s*)_xsrf=([^;]*)/);
    return match ? decodeURIComponent(match[1]) : "";
  }
  function api(method, path, body) {
    return fetch(baseUrl() + path, {
      method: method, credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-XSRFToken": xsrf() },
      body: body ? JSON.stringify(body) : undefined
    }).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (data) {
        if (!response.ok) throw new Error(data.message || response.statusText);
        return data;
      });
    });
  }
  function notify(app, message, type, actions) {
    return app.commands.execute("apputils:notify", {
      message: message, type: type || "info", options: { autoClose: actions ? false : 8000, actions: actions || [] }
    }).catch(function () { console.info("dsportal:", message); });
  }
  function openTemplateCopy(app, template, fresh, widget) {
    return api("POST", "dsportal/api/templates/open", { path: template, fresh: !!fresh }).then(function (answer) {
      if (answer.own_template) {
        notify(app, "You own " + template + ": what you save here is what every user sees.", "warning");
        return answer;
      }
      return app.commands.execute("docmanager:open", { path: answer.path }).then(function () {
        if (widget) widget.close();
        var message = answer.created
          ? "This is your own copy, " + answer.path + ": edit and run it freely. The template stays as it is."
          : "Opened your copy " + answer.path + " (made earlier, kept as you left it).";
        if (answer.template_updated) {
          notify(app, message + " The template has changed since you copied it.", "info", [{
            label: "Open a fresh copy", commandId: "dsportal:fresh-template-copy", args: { path: template }
          }]);
        } else {
          notify(app, message, "info");
        }
        return answer;
      });
    }).catch(function (error) {
      notify(app, "Could not make your copy of " + template + ": " + error.message, "error");
    });
  }
  function watchTemplates(app) {
    var seen = typeof WeakSet === "function" ? new WeakSet() : null;
    return api("GET", "dsportal/api/templates").then(function (info) {
      var prefix = info.folder + "/";
      window.dsportalLab.templatesFolder = info.folder;
      function check() {
        var widgets = app.shell.widgets("main");
        var next = widgets.next();
        while (!next.done) {
          var widget = next.value;
          next = widgets.next();
          var path = widget && widget.context && widget.context.path;
          if (!path || path.indexOf(prefix) !== 0 || (seen && seen.has(widget)) || path === prefix + "README.md") continue;
          if (seen) seen.add(widget);
          openTemplateCopy(app, path, false, widget);
        }
      }
      app.shell.layoutModified.connect(check);
      app.shell.currentChanged.connect(check);
      check();
    }).catch(function () { /* a session without templates */ });
  }
  function duration(seconds) {
    if (seconds < 60) return seconds + " s";
    var minutes = Math.round(seconds / 60);
    if (minutes < 60) return minutes + " min";
    return Math.floor(minutes / 60) + " h " + ("0" + (minutes % 60)).slice(-2) + " min";
  }
  function watchIdle(app) {
    // The hub stops a session nobody uses for its partition's idle limit (GPUs go back to the
    // queue): say so before it happens, with a button that counts as use. Reading this API does
    // not count as use, so the tab being open does not keep the session alive by itself.
    var shown = null;
    function look() {
      return api("GET", "dsportal/api/idle").then(function (state) {
        if (!state.limit_s) return;
        var warnFrom = Math.min(600, Math.floor(state.limit_s / 2));
        if (state.stop_in_s <= warnFrom && shown === null) {
          shown = notify(app, "This session has not been used for " + duration(state.idle_s) + ": it will be stopped in about " +
            duration(state.stop_in_s) + " so its resources go back to others (limit " + duration(state.limit_s) +
            "). Running code, even silently, counts as use.", "warning",
            [{ label: "Keep my session", commandId: "dsportal:keep-session", displayType: "accent" }]);
        } else if (state.stop_in_s > warnFrom && shown !== null) {
          shown.then(function (id) { if (id) app.commands.execute("apputils:dismiss-notification", { id: id }); });
          shown = null;
        }
        window.dsportalLab.idle = state;
        setTimeout(look, 1000 * Math.max(5, Math.min(60, Math.floor(state.limit_s / 4))));
      }).catch(function () { setTimeout(look, 60000); });
    }
    app.commands.addCommand("dsportal:keep-session", {
      label: "Keep my session",
      execute: function () {
        return api("POST", "dsportal/api/idle").then(function () {
          if (shown !== null) {
            shown.then(function (id) { if (id) app.commands.execute("apputils:dismiss-notification", { id: id }); });
            shown = null;
          }
          notify(app, "Your session is kept: the idle clock starts again.", "info");
        });
      }
    });
    look();
  }
  function openTensorBoard(folder) {
    window.open(baseUrl() + "dsportal/tensorboard-open?logdir=" + encodeURIComponent(folder || "."), "_blank");
  }

  function plugin(ILauncher, ICommandPalette) {
    return {
      id: "dsportal-lab:plugin",
      autoStart: true,
      optional: [ILauncher, ICommandPalette].filter(Boolean),
      activate: function (app, a, b) {
        var launcher = ILauncher ? a : null;
        var palette = ICommandPalette ? (ILauncher ? b : a) : null;
        app.commands.addCommand("dsportal:open-tensorboard", {
          label: "Open TensorBoard",
          caption: "TensorBoard for this folder's logs, in a new tab",
          execute: function () { openTensorBoard(selectedFolder(app)); }
        });
        app.commands.addCommand("dsportal:open-tensorboard-here", {
          label: "TensorBoard (this folder)",
          caption: "TensorBoard for the file browser's current folder",
          execute: function () { openTensorBoard(currentFolder(app)); }
        });
        app.commands.addCommand("dsportal:open-jobs", {
          label: "Multi-node jobs",
          caption: "Launch, follow and cancel multi-node (Horovod/MPI) jobs",
          execute: function () { window.open(baseUrl() + "dsportal/jobs", "_blank"); }
        });
        app.commands.addCommand("dsportal:fresh-template-copy", {
          label: "Open a fresh copy",
          caption: "Copy the template's current version beside your earlier copy",
          execute: function (args) { return openTemplateCopy(app, args.path, true, null); }
        });
        app.contextMenu.addItem({ command: "dsportal:open-tensorboard", selector: '.jp-DirListing-item[data-isdir="true"]', rank: 3 });
        app.contextMenu.addItem({ command: "dsportal:open-tensorboard-here", selector: ".jp-DirListing-content", rank: 100 });
        if (launcher) {
          launcher.add({ command: "dsportal:open-jobs", category: "Other", rank: 1 });
          launcher.add({ command: "dsportal:open-tensorboard-here", category: "Other", rank: 2 });
        }
        if (palette) {
          ["dsportal:open-jobs", "dsportal:open-tensorboard-here"].forEach(function (command) {
            palette.addItem({ command: command, category: "dsportal" });
          });
        }
        window.dsportalLab = { loaded: true };
        app.restored.then(function () { watchIdle(app); return watchTemplates(app); });
      }
    };
  }

  _JUPYTERLAB = _JUPYTERLAB || {};
  _JUPYTERLAB["dsportal-lab"] = {
    init: function (scope) { shareScope = scope; return Promise.resolve(); },
    get: function (module) {
      if (module !== "./extension") {
        return Promise.reject(new Error('Module "' + module + '" does not exist in container.'));
      }
      return Promise.all([shared("@jupyterlab/launcher", "ILauncher"), shared("@jupyterlab/apputils", "ICommandPalette")])
        .then(function (tokens) {
          var exported = { __esModule: true, default: [plugin(tokens[0], tokens[1])] };
          return function () { return exported; };
        });
    }
  };
})();
