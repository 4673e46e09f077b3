// Progressive enhancement only: every page works without this file.
// A filter or chart option applies as soon as it is chosen (without JS, the form's button does it).
document.addEventListener("DOMContentLoaded", () => {
  for (const form of document.querySelectorAll("form.controls")) {
    form.classList.add("auto");
    for (const select of form.querySelectorAll("select")) {
      select.addEventListener("change", () => form.submit());
    }
  }
});
