// Every figure opens full-size on tap (issue 37): each image in a figure becomes a link to the image itself (the
// PNG the page shows; the figure's Download line links the 300 dpi PNG and the SVG).
document.addEventListener("DOMContentLoaded", () => {
  for (const img of document.querySelectorAll("main figure img")) {
    if (img.closest("a")) continue;
    const link = document.createElement("a");
    link.href = img.getAttribute("src");
    link.className = "bn-full-size";
    link.title = "Open the figure full-size";
    img.replaceWith(link);
    link.appendChild(img);
  }
});
