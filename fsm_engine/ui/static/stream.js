// fsm_engine viewer: the live text of a running instance, from /instances/{id}/stream.
// Same-origin only (the page's CSP names 'self'); every value lands in textContent, never HTML.
"use strict";
(function () {
  var live = document.getElementById("live");
  if (!live || !window.EventSource) { return; }
  var text = document.getElementById("live-text");
  var partial = document.getElementById("live-partial");
  var log = document.getElementById("live-events");
  var state = document.getElementById("current-state");
  var source = new EventSource(live.getAttribute("data-src"));

  function note(message, kind) {
    var item = document.createElement("li");
    item.textContent = message;
    item.className = "live-" + kind;
    log.appendChild(item);
  }

  function shown(d) {
    switch (d.kind) {
      case "open":
        text.textContent = "";
        text.className = "";
        partial.textContent = "";
        note("step " + d.seq + " attempt " + d.attempt, d.kind);
        break;
      case "chunk":
        text.textContent += d.text;
        if (d.partial !== undefined) { partial.textContent = JSON.stringify(d.partial, null, 2); }
        live.setAttribute("data-chars", String(text.textContent.length));
        break;
      case "superseded":
        text.className = "superseded";
        note("step " + d.seq + " attempt " + d.attempt + " superseded by step " + d.by[0] +
             " attempt " + d.by[1], d.kind);
        break;
      case "error":
        note("step " + d.seq + " attempt " + d.attempt + " failed: " + (d.info || {}).error, d.kind);
        break;
      case "end":
        note("step " + d.seq + " attempt " + d.attempt + " complete", d.kind);
        break;
      case "step":
        if (state) { state.textContent = d.dest; }
        var info = d.info || {};  // an agent tool call's result (or error), as text
        var said = info.result !== undefined ? " = " + info.result :
          (info.error !== undefined ? " failed: " + info.error : "");
        note("step " + d.seq + ": " + d.source + " --" + d.trigger + "--> " + d.dest + said, d.kind);
        break;
      case "final":
        source.close();
        live.setAttribute("data-final", d.status);
        window.location.reload();
        break;
    }
  }

  source.onmessage = function (e) { shown(JSON.parse(e.data)); };
  // the server could not go on (a malformed stored row, the database gone): said once,
  // not reconnected every second
  source.addEventListener("fsm-error", function (e) {
    var d = {};
    source.close();
    try { d = JSON.parse(e.data); } catch (ignored) { d = {}; }
    note("stream stopped: " + (d.error || "error"), "error");
    live.setAttribute("data-error", String(d.error || "error"));
  });
}());
