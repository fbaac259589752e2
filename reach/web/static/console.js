// reach web: live updates. The page names its live view in <body data-live>; the server
// sends HTML fragments by element id over Server-Sent Events, and they replace the
// element's content. Everything else is plain links and forms.
"use strict";
(function () {
  var url = document.body.getAttribute("data-live");
  if (!url || !window.EventSource) return;
  var conn = document.getElementById("conn");
  function say(text, cls) {
    if (!conn) return;
    conn.textContent = text;
    conn.className = "conn " + (cls || "");
  }
  var es = new EventSource(url);
  es.onopen = function () { say("live", "ok"); };
  es.onerror = function () { say("reconnecting…", "bad"); };
  es.addEventListener("fragments", function (e) {
    var parts = JSON.parse(e.data);
    Object.keys(parts).forEach(function (id) {
      var el = document.getElementById(id);
      if (el) el.innerHTML = parts[id];
    });
    say("live", "ok");
    document.body.setAttribute("data-updates",
      String(Number(document.body.getAttribute("data-updates") || 0) + 1));
  });
  es.addEventListener("problem", function (e) { say(JSON.parse(e.data), "bad"); });
  window.addEventListener("pagehide", function () { es.close(); });
})();
