// Small inline-SVG charts on the unit square (scores and shares from 0 to 1): numbers in, an <svg>
// element out. Text from the api goes in as text nodes, never as markup.

import { percent } from "./util.js";

const NS = "http://www.w3.org/2000/svg";
const TICKS = [0, 0.25, 0.5, 0.75, 1];

export function svg(tag, attributes = {}, ...children) {
  const node = document.createElementNS(NS, tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value !== undefined && value !== null && value !== false) node.setAttribute(name, String(value));
  }
  node.append(...children.flat().filter((c) => c !== undefined && c !== null && c !== false));
  return node;
}

const tick = (v) => String(v).replace(/^0\./, "."); // 0, .25, .5, .75, 1

// Axes from 0 to 1 both ways, with a grid; `x` and `y` map a value to its pixel.
function frame({ label, xTitle, yTitle, width = 360, height = 230 }) {
  const margin = { left: 42, right: 12, top: 16, bottom: 38 };
  const x = (v) => margin.left + v * (width - margin.left - margin.right);
  const y = (v) => margin.top + (1 - v) * (height - margin.top - margin.bottom);
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": label });
  const grid = svg("g", { class: "grid" });
  for (const t of TICKS) {
    grid.append(
      svg("line", { x1: x(0), x2: x(1), y1: y(t), y2: y(t) }),
      svg("text", { x: x(0) - 6, y: y(t) + 4, "text-anchor": "end" }, tick(t)),
      svg("text", { x: x(t), y: y(0) + 15, "text-anchor": "middle" }, tick(t)),
    );
  }
  grid.append(
    svg("text", { class: "axis-title", x: (x(0) + x(1)) / 2, y: height - 4, "text-anchor": "middle" }, xTitle),
    svg("text", { class: "axis-title", x: 12, y: (y(0) + y(1)) / 2, "text-anchor": "middle", transform: `rotate(-90 12 ${(y(0) + y(1)) / 2})` }, yTitle),
  );
  root.append(grid);
  return { root, x, y };
}

const points = (pairs, x, y) => pairs.map(([a, b]) => `${x(a).toFixed(1)},${y(b).toFixed(1)}`).join(" ");

// Accuracy per confidence bin against the diagonal (perfect calibration); the gap between a bin's
// accuracy and its mean confidence is outlined. Bins with no prediction are left out.
export function reliabilityChart(bins) {
  const filled = bins.filter((b) => b.count > 0);
  const { root, x, y } = frame({
    label: `Reliability: accuracy per confidence bin, ${filled.length} bins with predictions`,
    xTitle: "confidence",
    yTitle: "accuracy",
  });
  for (const bin of filled) {
    const [left, right] = [x(bin.lower) + 1, x(bin.upper) - 1];
    const title = svg("title", {}, `${tick(bin.lower)}–${tick(bin.upper)}: ${bin.count} predictions, mean confidence ${bin.confidence.toFixed(3)}, accuracy ${bin.accuracy.toFixed(3)}`);
    const top = Math.min(y(bin.accuracy), y(bin.confidence));
    root.append(
      svg("rect", { class: "bin", x: left, width: right - left, y: y(bin.accuracy), height: y(0) - y(bin.accuracy) }, title),
      svg("rect", { class: "gap", x: left, width: right - left, y: top, height: Math.abs(y(bin.accuracy) - y(bin.confidence)) }),
      svg("text", { class: "count", x: (left + right) / 2, y: Math.max(top - 3, 9), "text-anchor": "middle" }, String(bin.count)),
    );
  }
  root.append(svg("line", { class: "diagonal", x1: x(0), y1: y(0), x2: x(1), y2: y(1) }));
  return root;
}

// Coverage (share answered) and accuracy on what is answered, by threshold; `threshold` (the slider)
// and `current` (the task's min_confidence, or null) are marked.
export function coverageChart(curve, threshold, current) {
  const { root, x, y } = frame({
    label: `Coverage and accuracy by confidence threshold; threshold ${threshold.toFixed(2)}`,
    xTitle: "threshold (min confidence)",
    yTitle: "share",
  });
  const answered = curve.filter((p) => p.accuracy !== null);
  root.append(
    svg("polyline", { class: "line coverage", points: points(curve.map((p) => [p.threshold, p.coverage]), x, y) }),
    svg("polyline", { class: "line accuracy", points: points(answered.map((p) => [p.threshold, p.accuracy]), x, y) }),
  );
  root.append(svg("line", { class: "cursor", x1: x(threshold), x2: x(threshold), y1: y(0), y2: y(1) }));
  if (current !== null && current !== undefined) {
    root.append(
      svg("line", { class: "current", x1: x(current), x2: x(current), y1: y(0), y2: y(1) }),
      svg("text", { class: "current-label", x: x(current) + 3, y: y(1) - 4 }, "the task's"),
    );
  }
  return root;
}

// One bar per version, oldest first: its dev accuracy as served (util.servedAccuracy); the version served is drawn solid.
export function versionsChart(versions) {
  const width = 360;
  const height = 150;
  const margin = { left: 42, right: 12, top: 10, bottom: 22 };
  const y = (v) => margin.top + (1 - v) * (height - margin.top - margin.bottom);
  const slot = (width - margin.left - margin.right) / Math.max(versions.length, 1);
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": `Dev accuracy of ${versions.length} versions, oldest first` });
  const grid = svg("g", { class: "grid" });
  for (const t of [0, 0.5, 1]) {
    grid.append(
      svg("line", { x1: margin.left, x2: width - margin.right, y1: y(t), y2: y(t) }),
      svg("text", { x: margin.left - 6, y: y(t) + 4, "text-anchor": "end" }, tick(t)),
    );
  }
  root.append(grid);
  versions.forEach((version, i) => {
    const left = margin.left + i * slot + slot * 0.2;
    const barWidth = Math.min(slot * 0.6, 40);
    const center = left + barWidth / 2;
    root.append(svg("text", { x: center, y: height - 6, "text-anchor": "middle" }, `#${i + 1}`));
    if (typeof version.accuracy !== "number") return;
    root.append(
      svg("rect", { class: `version-bar ${version.state}`, x: left, width: barWidth, y: y(version.accuracy), height: y(0) - y(version.accuracy) },
        svg("title", {}, `#${i + 1} ${version.version} (${version.state}): dev accuracy ${percent(version.accuracy)}`)),
      svg("text", { class: "count", x: center, y: Math.max(y(version.accuracy) - 3, 9), "text-anchor": "middle" }, percent(version.accuracy)),
    );
  });
  return root;
}
