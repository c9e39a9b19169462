"""A task's quality report (`quality.describe`'s dict) as a person reads it: the headline, per label,
confusion, calibration, thresholds and suspect examples. `openbook report` and `openbook eval` print it."""

from __future__ import annotations

from typing import Any

TARGETS = (0.9, 0.95)  # the accuracies whose thresholds the summary names


def format_report(report: dict[str, Any]) -> str:
    """The report as a person reads it; its headline names `task` or `checkpoint`, `model_version`,
    the examples scored and what scored them (`scored_by`)."""
    from openbook.quality import CoveragePoint, threshold_for_accuracy

    labels = report["confusion"]["labels"]
    width = max(8, *(len(label) for label in labels))
    lines = [
        f"{report.get('task') or report.get('checkpoint')}: version {report['model_version']}, "
        f"{report['examples']} examples scored by {report['scored_by']}",
        f"accuracy {report['accuracy']:.3f}   macro-F1 {report['macro_f1']:.3f}   ECE {report['ece']:.3f}",
        "",
        f"{'label':<{width}}  precision  recall     f1  support",
    ]
    for label, scores in report["per_label"].items():
        lines.append(
            f"{label:<{width}}  {scores['precision']:9.3f}  {scores['recall']:6.3f}  {scores['f1']:5.3f}"
            f"  {scores['support']:7d}"
        )
    lines += [
        "",
        "confusion (rows: gold, columns: predicted)",
        " " * width + "".join(f"{x:>{width + 1}}" for x in labels),
    ]
    for label, row in zip(labels, report["confusion"]["matrix"], strict=True):
        lines.append(f"{label:<{width}}" + "".join(f"{count:>{width + 1}d}" for count in row))
    readers = report.get("readers")
    if readers:
        lines += ["", readers_line(readers, report["accuracy"])]
    pairs = report.get("confused_pairs", [])
    lines += ["", f"most confused ({len(pairs)}): labelled -> predicted: examples"]
    lines += [f"  {pair['label']} -> {pair['predicted']}: {pair['count']}" for pair in pairs]
    calibration = report.get("calibration")
    if calibration:
        verdict = "adopted" if calibration["adopted"] else "not adopted"
        lines += [
            "",
            f"calibration: ECE {calibration['ece_before']:.3f} before, {calibration['ece_after']:.3f} after "
            f"temperature scaling ({calibration['folds']}-fold cross-validated; T = "
            f"{calibration['fitted_temperature']:.2f}, {verdict}; "
            f"served at T = {calibration['temperature']:.2f})",
        ]
    lines += ["", "threshold  coverage  accuracy"]
    for point in report["coverage"]:
        accuracy = "-" if point["accuracy"] is None else f"{point['accuracy']:.3f}"
        lines.append(f"{point['threshold']:9.2f}  {point['coverage']:8.3f}  {accuracy:>8}")
    coverage = [CoveragePoint(**point) for point in report["coverage"]]
    for target in TARGETS:
        reached = threshold_for_accuracy(coverage, target)
        lines.append(
            f"accuracy >= {target:.0%}: "
            + (
                "not reached at any threshold"
                if reached is None
                else f"min_confidence {reached.threshold:.2f} answers {reached.coverage:.0%} of them"
            )
        )
    suspects = report["suspect_examples"]
    lines += ["", f"suspect examples ({len(suspects)}): labelled, predicted, confidence"]
    for suspect in suspects[:20]:
        text = suspect.get("text")
        shown = "" if text is None else f"  {str(text)[:60]!r}"
        lines.append(
            f"  {suspect['id']:>8}  {suspect['label']} -> {suspect['predicted']}"
            f"  {suspect['confidence']:.3f}{shown}"
        )
    return "\n".join(lines)


def readers_line(readers: dict[str, Any], served: float) -> str:
    """Each reader alone beside the served prediction, e.g. "readers: the prompt alone 0.812, the book
    alone (keyed by mpnet) 0.850, served with the book at λ 0.50: 0.862"."""

    def figure(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    lam = "" if readers["lam"] is None else f" at λ {readers['lam']:.2f}"
    return (
        f"readers: the prompt alone {figure(readers['prompt'])}, the book alone (keyed by "
        f"{readers['book_keyed_by']}) {figure(readers['book'])}, served with the book{lam}: {served:.3f}"
    )
