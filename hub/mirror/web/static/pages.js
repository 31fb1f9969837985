// Progressive enhancement; every page works without this script.
// - the repo list: filter the rows shown as you type (the form filters on submit);
// - copy buttons: copy the text of the element named by data-copy.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var box = document.querySelector("input[data-filter]");
  if (box) {
    var rows = document.querySelectorAll(box.getAttribute("data-filter"));
    box.addEventListener("input", function () {
      var needle = box.value.trim().toLowerCase();
      rows.forEach(function (row) {
        var name = row.getAttribute("data-name");
        if (name === null) { return; }
        row.hidden = needle !== "" && name.indexOf(needle) === -1;
      });
    });
  }
  document.querySelectorAll("button[data-copy]").forEach(function (button) {
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source) { return; }
    var label = button.textContent;
    function done(ok) {
      button.textContent = ok ? "Copied" : "Select and copy by hand";
      button.setAttribute("data-copied", ok ? "yes" : "no");
      window.setTimeout(function () { button.textContent = label; }, 2000);
    }
    function fallback(text) {
      // Plain http on another host is not a secure context: no Clipboard API there.
      var area = document.createElement("textarea");
      area.value = text;
      area.setAttribute("readonly", "");
      area.className = "offscreen";
      document.body.appendChild(area);
      area.select();
      var ok = false;
      try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
      document.body.removeChild(area);
      done(ok);
    }
    button.hidden = false;
    button.addEventListener("click", function () {
      var text = source.textContent;
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(function () { done(true); },
                                                 function () { fallback(text); });
      } else {
        fallback(text);
      }
    });
  });
});
