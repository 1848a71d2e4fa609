// Keeps a page's live part current, without a reload.
//
// The pages of tasks (the overview, the task list, a task) follow the task event feed: the
// console's Server-Sent Events stream (/ui/events/stream, the API's GET /v1/events/stream with the
// session), filtered to what the page shows. An event refreshes the page's #live part at once: the
// page is fetched again and its #live element replaces the one shown. The stream ends every few
// seconds on the server's side; EventSource reconnects with Last-Event-ID and misses nothing.
//
// Without the feed (a browser without EventSource, a page no task event changes, the server's
// bound on streams reached, the stream refused) the page is fetched again data-refresh seconds
// after the last refresh finished, while the tab is visible, and the feed is tried again later.
//
// Never two refreshes at once, and not more than one a second: events that arrive meanwhile ask
// for one more after it (a burst of a thousand events is two refreshes, not a thousand). A page
// that no longer has #live (the session ended: the login form came back) stops refreshing and
// reloads.
(function () {
  "use strict";

  // after the feed was refused or failed, read the page this long before trying the feed again
  var FEED_RETRY_MS = 30000;
  // a refresh starts at least this long after the one before it (a busy overview reads itself
  // once a second, not once per event)
  var REFRESH_GAP_MS = 1000;
  // where the console is mounted: this script is its static/console.js
  var script = document.currentScript;
  var root = script ? script.src.replace(/\/static\/console\.js(\?.*)?$/, "") : "";

  // The feed's filters for this page, or null when no task event changes it.
  function feedQuery() {
    var path = window.location.pathname;
    var base = new URL(root || window.location.origin).pathname.replace(/\/$/, "");
    if (path.indexOf(base) !== 0) {
      return null;
    }
    path = path.slice(base.length) || "/";
    var query = new URLSearchParams();
    var task = /^\/tasks\/([0-9a-fA-F-]{36})$/.exec(path);
    if (task) {
      query.set("task", task[1]);
      return query;
    }
    if (path === "/tasks") {
      var shown = new URLSearchParams(window.location.search);
      ["queue", "kind"].forEach(function (name) {
        if (shown.get(name)) {
          query.set(name, shown.get(name));
        }
      });
      return query;
    }
    return path === "/" ? query : null;
  }

  function start() {
    var live = document.getElementById("live");
    if (!live || !live.dataset.refresh) {
      return;
    }
    var seconds = Math.max(1, parseInt(live.dataset.refresh, 10) || 5);
    var query = feedQuery();
    var stopped = false;
    var refreshing = false;
    var again = false;
    var source = null;
    var timer = null;
    var lastStart = 0;
    var deferred = null;

    function replaceLive(fresh) {
      var shown = document.getElementById("live");
      // ticked rows stay ticked, and opened details open, across a refresh
      var ticked = {};
      shown.querySelectorAll("input[type=checkbox]:checked").forEach(function (box) {
        ticked[box.value] = true;
      });
      var opened = Array.prototype.map.call(shown.querySelectorAll("details"), function (details) {
        return details.open;
      });
      shown.replaceChildren.apply(shown, Array.prototype.slice.call(fresh.childNodes).map(function (node) {
        return document.importNode(node, true);
      }));
      shown.querySelectorAll("input[type=checkbox]").forEach(function (box) {
        box.checked = !!ticked[box.value];
      });
      shown.querySelectorAll("details").forEach(function (details, i) {
        if (opened[i]) {
          details.open = true;
        }
      });
    }

    function refresh() {
      if (stopped) {
        return;
      }
      if (refreshing) {
        again = true;
        return;
      }
      if (document.hidden) {
        again = true;  // when the tab is shown again
        return;
      }
      var wait = lastStart + REFRESH_GAP_MS - Date.now();
      if (wait > 0) {
        if (!deferred) {
          deferred = window.setTimeout(function () {
            deferred = null;
            refresh();
          }, wait);
        }
        return;
      }
      lastStart = Date.now();
      refreshing = true;
      again = false;
      fetch(window.location.href, {credentials: "same-origin", headers: {"Accept": "text/html"}})
        .then(function (response) {
          return response.ok ? response.text() : Promise.reject(response.status);
        })
        .then(function (text) {
          var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("live");
          if (!fresh) {
            stopped = true;
            if (source) {
              source.close();
            }
            window.location.reload();
            return;
          }
          replaceLive(fresh);
        })
        .catch(function () { /* the next one tries again */ })
        .then(function () {
          refreshing = false;
          if (again) {
            refresh();
          }
          if (!source) {
            poll();
          }
        });
    }

    // without the feed: read the page again in a while
    function poll() {
      window.clearTimeout(timer);
      if (!stopped && !source) {
        timer = window.setTimeout(refresh, seconds * 1000);
      }
    }

    function follow() {
      if (stopped || !window.EventSource || query === null) {
        return;
      }
      var opened = false;
      source = new EventSource(root + "/events/stream" + (query.toString() ? "?" + query : ""));
      source.onopen = function () {
        window.clearTimeout(timer);
        document.documentElement.setAttribute("data-live", "feed");
        if (!opened) {
          opened = true;
          refresh();  // what committed between the page's answer and the stream's start
        }
      };
      source.onmessage = refresh;
      source.onerror = function () {
        if (source && source.readyState === EventSource.CLOSED) {
          // refused (the bound, the session ended): read the page meanwhile, then try again
          source = null;
          document.documentElement.setAttribute("data-live", "poll");
          poll();
          window.setTimeout(follow, FEED_RETRY_MS);
        }
      };
    }

    document.addEventListener("visibilitychange", function () {
      if (!document.hidden && again) {
        refresh();
      }
    });
    window.addEventListener("pagehide", function () {
      if (source) {
        source.close();  // the server's room for streams is freed at once
      }
    });
    follow();
    poll();
  }

  // A form with data-confirm asks first (a purge cannot be undone).
  document.addEventListener("submit", function (event) {
    var question = event.target.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });

  // "3 min ago" stays true while the page is open: each <time data-relative> is written again
  // from its datetime every few seconds (the server wrote it as of the page's answer)
  function durationText(seconds) {
    var whole = Math.floor(seconds);
    if (whole < 60) {
      return whole + " s";
    }
    var parts = [];
    [["d", 86400], ["h", 3600], ["min", 60], ["s", 1]].forEach(function (unit) {
      if (parts.length < 2 && (whole >= unit[1] || parts.length)) {
        parts.push([Math.floor(whole / unit[1]), unit[0]]);
        whole %= unit[1];
      }
    });
    return parts.filter(function (p) { return p[0]; }).map(function (p) { return p[0] + " " + p[1]; }).join(" ");
  }

  function relativeTimes() {
    document.querySelectorAll("time[data-relative]").forEach(function (node) {
      var at = Date.parse(node.getAttribute("datetime"));
      if (isNaN(at)) {
        return;
      }
      var seconds = (Date.now() - at) / 1000;
      node.textContent = Math.abs(seconds) < 1 ? "just now"
        : seconds > 0 ? durationText(seconds) + " ago" : "in " + durationText(-seconds);
    });
  }

  document.addEventListener("DOMContentLoaded", start);
  document.addEventListener("DOMContentLoaded", function () {
    window.setInterval(relativeTimes, 10000);
  });
}());
