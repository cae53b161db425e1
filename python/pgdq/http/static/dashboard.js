// The dashboard's only hand-written script (a file, not inline: the pages'
// policy allows scripts from this origin only).

// A refused action (4xx) says why in #message; everything else is htmx.
document.body.addEventListener("htmx:responseError", (e) => {
  let text = e.detail.xhr.responseText;
  try { text = JSON.parse(text).error; } catch (_) {}
  document.getElementById("message").textContent = `${e.detail.xhr.status}: ${text}`;
});
// An action that worked clears the last refusal.
document.body.addEventListener("htmx:afterRequest", (e) => {
  if (e.detail.successful && e.detail.requestConfig.verb !== "get") document.getElementById("message").textContent = "";
});

// Draw a canvas's chart from its data-chart (see _counts_chart in _dashboard.py):
// {type, labels, datasets: [{label, color, data}], stacked?, unit?}.
function draw(canvas) {
  if (canvas.chart) return;
  const spec = JSON.parse(canvas.dataset.chart);
  const axis = (stacked) => ({ stacked: Boolean(stacked) });
  canvas.chart = new Chart(canvas, {
    type: spec.type,
    data: {
      labels: spec.labels,
      datasets: spec.datasets.map((d) => ({
        label: d.label, data: d.data, backgroundColor: d.color, borderColor: d.color, pointRadius: spec.type === "line" ? 2 : 0, borderWidth: spec.type === "line" ? 2 : 0,
      })),
    },
    options: {
      animation: false,
      maintainAspectRatio: false,
      plugins: { legend: { display: spec.datasets.length > 1 } },
      scales: {
        x: axis(spec.stacked),
        y: { ...axis(spec.stacked), beginAtZero: true, ticks: spec.unit ? {} : { precision: 0 }, title: { display: Boolean(spec.unit), text: spec.unit || "" } },
      },
    },
  });
}

// The first paint's charts, then each fragment's as htmx swaps it in.
const drawAll = () => document.querySelectorAll("canvas[data-chart]").forEach(draw);
drawAll();
document.body.addEventListener("htmx:afterSettle", drawAll);
