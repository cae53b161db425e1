// The dashboard's only hand-written script (a file, not inline: the pages'
// policy allows scripts from this origin only).

// A refused action (4xx) says why in #message; everything else is htmx.
document.body.addEventListener("htmx:responseError", (e) => {
  let text = e.detail.xhr.responseText;
  try { text = JSON.parse(text).error; } catch (_) {}
  document.getElementById("message").textContent = `${e.detail.xhr.status}: ${text}`;
});

// Draw the chart of a fragment's canvas from its data-chart (see _queue.html).
document.body.addEventListener("htmx:afterSettle", () => {
  const canvas = document.getElementById("due-chart");
  if (!canvas || canvas.chart) return;
  const data = JSON.parse(canvas.dataset.chart);
  canvas.chart = new Chart(canvas, {
    type: "bar",
    data: { labels: data.labels, datasets: [{ label: "messages falling due", data: data.due, backgroundColor: "#4f7fd9" }] },
    options: { animation: false, maintainAspectRatio: false, plugins: { legend: { display: false } }, scales: { y: { beginAtZero: true, ticks: { precision: 0 } } } },
  });
});
