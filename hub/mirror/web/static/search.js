// Progressive enhancement: filter the repo rows shown as you type. The search
// form works without this script (the server filters on submit).
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var box = document.querySelector("input[data-filter]");
  if (!box) { return; }
  var rows = document.querySelectorAll(box.getAttribute("data-filter"));
  box.addEventListener("input", function () {
    var needle = box.value.trim().toLowerCase();
    rows.forEach(function (row) {
      var name = row.getAttribute("data-name");
      if (name === null) { return; }
      row.hidden = needle !== "" && name.indexOf(needle) === -1;
    });
  });
});
