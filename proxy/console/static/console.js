// Tollhouse console: copy buttons, times in the browser's time zone (UTC beside) and the
// browser's zone in the period forms. The pages work without it: times then read in UTC.
document.addEventListener("click", function (event) {
  var button = event.target.closest("button.copy");
  if (!button) return;
  var source = document.getElementById(button.dataset.copy);
  if (!source || !navigator.clipboard) return;
  navigator.clipboard.writeText(source.textContent).then(function () {
    button.textContent = "Copied";
  });
});

document.addEventListener("DOMContentLoaded", function () {
  var zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  var two = function (n) { return String(n).padStart(2, "0"); };
  document.querySelectorAll("time[datetime]").forEach(function (el) {
    var at = new Date(el.getAttribute("datetime"));
    if (isNaN(at) || zone === "UTC") return;
    var local = at.getFullYear() + "-" + two(at.getMonth() + 1) + "-" + two(at.getDate()) +
      " " + two(at.getHours()) + ":" + two(at.getMinutes()) + ":" + two(at.getSeconds());
    var utc = el.textContent;
    el.textContent = local + " ";
    var beside = document.createElement("span");
    beside.className = "utc";
    beside.textContent = "(" + utc + ")";
    el.appendChild(beside);
  });
  document.querySelectorAll("fieldset.period select").forEach(function (select) {
    select.addEventListener("change", function () {
      if (!select.value) return;
      select.form.querySelectorAll("input[type=datetime-local]").forEach(function (input) {
        input.value = "";
      });
    });
  });
  document.querySelectorAll("input.tz").forEach(function (input) {
    if (!input.value) input.value = zone;
    var label = input.parentNode.querySelector(".zone");
    if (label && input.value !== "UTC") label.textContent = "in " + input.value + "; UTC beside each time";
  });
});
