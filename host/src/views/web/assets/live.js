// conduit web: refreshes the parts of a page marked `data-live` (each with an id) every
// `data-refresh` milliseconds, by fetching the same page and swapping those parts in. The page
// itself is complete without this script. It pauses while the tab is hidden or a form field
// has the focus, and stops after an error until the next successful fetch.
(function () {
  "use strict";
  var every = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  if (!every) { return; }
  var busy = false;
  function typing() {
    var a = document.activeElement;
    return a && (a.tagName === "INPUT" || a.tagName === "SELECT" || a.tagName === "TEXTAREA");
  }
  function refresh() {
    if (busy || document.hidden || typing()) { return; }
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Conduit-Live": "1" } })
      .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.text(); })
      .then(function (text) {
        var doc = new DOMParser().parseFromString(text, "text/html");
        document.querySelectorAll("[data-live][id]").forEach(function (el) {
          var fresh = doc.getElementById(el.id);
          if (fresh) { el.replaceWith(document.importNode(fresh, true)); }
        });
        document.body.setAttribute("data-refreshed", String(Date.now()));
      })
      .catch(function () { /* the next tick tries again */ })
      .then(function () { busy = false; });
  }
  window.setInterval(refresh, every);
})();
