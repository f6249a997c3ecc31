(function () {
  var main = document.getElementById("main"), note = document.getElementById("refresh");
  var every = parseInt(main.getAttribute("data-refresh-ms"), 10) || 2000;
  function tick() {
    if (document.hidden) { setTimeout(tick, every); return; }
    fetch("?part=main", { cache: "no-store" })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.text(); })
      .then(function (html) {
        main.innerHTML = html;
        note.textContent = "updated " + new Date().toLocaleTimeString() + ", every " + every / 1000 + " s";
        note.className = "muted";
      })
      .catch(function (e) { note.textContent = "not updating: " + e.message; note.className = "bad"; })
      .then(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
