// Keeps a page's live part current: data-refresh seconds after the last refresh finished, while
// the tab is visible, the page is fetched again and its #live element replaces the one shown.
// Never two at once: a slow page (a large overview, a busy database) would otherwise pile up
// fetches on the server, each as slow as the last. A page that no longer has #live (the session
// ended: the login form came back) stops refreshing and reloads.
(function () {
  "use strict";

  function start() {
    var live = document.getElementById("live");
    if (!live || !live.dataset.refresh) {
      return;
    }
    var seconds = Math.max(1, parseInt(live.dataset.refresh, 10) || 5);
    var stopped = false;

    function next() {
      if (!stopped) {
        window.setTimeout(refresh, seconds * 1000);
      }
    }

    function refresh() {
      if (document.hidden) {
        next();
        return;
      }
      fetch(window.location.href, {credentials: "same-origin", headers: {"Accept": "text/html"}})
        .then(function (response) {
          return response.ok ? response.text() : Promise.reject(response.status);
        })
        .then(function (text) {
          var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("live");
          if (!fresh) {
            stopped = true;
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
        .catch(function () { /* the next one tries again */ })
        .then(next);
    }

    next();
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
