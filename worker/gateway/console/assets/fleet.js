// The fleet page's chart, fetched again every few seconds from the console's own origin (no other request,
// no library). Without this script the page shows the chart as it was when loaded.
(function () {
  "use strict";
  var box = document.getElementById("fleet-chart");
  if (!box) {
    return;
  }
  var every = Number(box.dataset.refreshSeconds || "2") * 1000;
  function refresh() {
    fetch(box.dataset.source, { credentials: "same-origin", redirect: "error" })
      .then(function (answer) {
        return answer.ok ? answer.text() : null;
      })
      .then(function (html) {
        if (html !== null) {
          box.innerHTML = html;
          box.dataset.refreshed = String(Number(box.dataset.refreshed || "0") + 1);
        }
      })
      .catch(function () {})
      .then(function () {
        setTimeout(refresh, every);
      });
  }
  setTimeout(refresh, every);
})();
