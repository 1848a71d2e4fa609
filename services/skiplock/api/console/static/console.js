// Keeps a page's live part current: every data-refresh seconds, while the tab is visible, the
// page is fetched again and its #live element replaces the one shown. A page that no longer
// has one (the session ended: the login form came back) stops refreshing and reloads.
(function () {
  "use strict";

  function start() {
    var live = document.getElementById("live");
    if (!live || !live.dataset.refresh) {
      return;
    }
    var seconds = Math.max(1, parseInt(live.dataset.refresh, 10) || 5);
    var timer = null;

    function refresh() {
      if (document.hidden) {
        return;
      }
      fetch(window.location.href, {credentials: "same-origin", headers: {"Accept": "text/html"}})
        .then(function (response) {
          return response.ok ? response.text() : Promise.reject(response.status);
        })
        .then(function (text) {
          var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("live");
          if (!fresh) {
            window.clearInterval(timer);
            window.location.reload();
            return;
          }
          // ticked rows stay ticked across a refresh
          var ticked = {};
          document.querySelectorAll("#live input[type=checkbox]:checked").forEach(function (box) {
            ticked[box.value] = true;
          });
          document.getElementById("live").replaceChildren.apply(
            document.getElementById("live"), Array.prototype.slice.call(fresh.childNodes).map(function (node) {
              return document.importNode(node, true);
            }));
          document.querySelectorAll("#live input[type=checkbox]").forEach(function (box) {
            box.checked = !!ticked[box.value];
          });
        })
        .catch(function () { /* the next tick tries again */ });
    }

    timer = window.setInterval(refresh, seconds * 1000);
  }

  // A form with data-confirm asks first (a purge cannot be undone).
  document.addEventListener("submit", function (event) {
    var question = event.target.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });

  document.addEventListener("DOMContentLoaded", start);
}());
