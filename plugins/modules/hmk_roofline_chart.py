#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Draws the roofline chart of a validation report as a PNG, on the control machine (matplotlib)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hmk_roofline_chart
short_description: Draw a validation report's roofline chart (PNG) with matplotlib
description:
  - Draws generation speed (tok/s) against the routed-expert gigabytes a token reads, on log-log axes, with the
    ceilings tok/s = bandwidth / GB per token at each given bandwidth, the band published runs reach, and the given
    points (published figures, the measured point, before and after tuning).
  - Meant for the control machine (delegate_to localhost with the controller's Python, which has matplotlib from the
    kit's requirements.txt). Without matplotlib it warns and writes nothing.
  - The file is replaced only when its bytes change (matplotlib's PNG carries no timestamp).
options:
  spec:
    description: The chart's content, as the validate_chart_spec filter returns it (title, note, bandwidths, points, band).
    type: dict
    required: true
  path:
    description: The PNG to write.
    type: path
    required: true
  width_px:
    description: Width of the image in pixels.
    type: int
    default: 1000
  height_px:
    description: Height of the image in pixels.
    type: int
    default: 650
requirements: [matplotlib]
author: hybrid-moe-kit
"""

EXAMPLES = r"""
- name: The roofline chart is drawn beside the report
  hmk.moe_kit.hmk_roofline_chart:
    spec: "{{ report | hmk.moe_kit.validate_chart_spec(validate_seed_figures, 'genoa-1x4090') }}"
    path: reports/epyc-node/validate-roofline.png
  delegate_to: localhost
"""

RETURN = r"""
available:
  description: Whether the chart was drawn (false without matplotlib, with the reason).
  type: bool
  returned: always
reason:
  description: Why no chart was drawn.
  type: str
  returned: when available is false
path:
  description: The PNG written.
  type: str
  returned: when available is true
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.hmk.moe_kit.plugins.module_utils.hmk_validate import check_all

DPI = 100
STYLES = {
    "published": {"marker": "^", "color": "#7f7f7f", "size": 70},
    "measured": {"marker": "o", "color": "#1f77b4", "size": 90},
    "before": {"marker": "o", "color": "#ff7f0e", "size": 90},
    "tuned": {"marker": "*", "color": "#2ca02c", "size": 220},
}


def spec_refusals(spec):
    """Refusals for a chart spec that is not what draw() reads: every number finite and not negative, every label
    text; named, so that a bad report ends in a sentence, not a traceback."""
    measure = {"rule": "number", "min": 0}
    label = {"rule": "text"}
    specs = [{"var": "spec.title", "value": spec.get("title") or "", "rule": "text"},
             {"var": "spec.note", "value": spec.get("note") or "", "rule": "text"},
             {"var": "spec.points", "value": spec.get("points") or [], "rule": "list",
              "elements": {"rule": "dict", "keys": {"rule": "choice", "choices": ["gb_per_token", "tps", "label", "kind"]}}},
             {"var": "spec.bandwidths", "value": spec.get("bandwidths") or [], "rule": "list",
              "elements": {"rule": "dict", "keys": {"rule": "choice", "choices": ["gbps", "label", "kind"]}}}]
    if spec.get("band"):
        specs.append({"var": "spec.band", "value": spec["band"], "rule": "list", "min_items": 2, "max_items": 2,
                      "elements": {"rule": "number", "min": 0, "max": 10}})
    out = check_all(specs)
    if out:
        return out
    for name, items, numbers in (("points", spec.get("points") or [], ("gb_per_token", "tps")),
                                 ("bandwidths", spec.get("bandwidths") or [], ("gbps",))):
        for index, item in enumerate(items):
            var = "spec.%s[%d]" % (name, index)
            specs = [dict(measure, var="%s.%s" % (var, key), value=item.get(key)) for key in numbers]
            specs.append(dict(label, var=var + ".label", value=item.get("label")))
            out += check_all(specs)
    return out


def _x_range(spec):
    xs = [float(p["gb_per_token"]) for p in spec.get("points") or [] if float(p["gb_per_token"]) > 0]
    if not xs:
        xs = [1.0, 20.0]
    return min(xs) / 3.0, max(xs) * 3.0


def draw(spec, path, width_px=1000, height_px=650):
    """Draw the chart into path (PNG). Raises ImportError without matplotlib."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import FormatStrFormatter, LogFormatter

    figure = Figure(figsize=(width_px / float(DPI), height_px / float(DPI)), dpi=DPI)
    axes = figure.add_subplot(1, 1, 1)
    low, high = _x_range(spec)
    xs = [low * (high / low) ** (i / 100.0) for i in range(101)]
    for bandwidth in spec.get("bandwidths") or []:
        gbps = float(bandwidth["gbps"])
        style = "-" if bandwidth.get("kind") == "theoretical" else "--"
        axes.plot(xs, [gbps / x for x in xs], style, color="#d62728" if style == "-" else "#9467bd",
                  label="ceiling at %s" % bandwidth["label"])
        if bandwidth.get("kind") == "theoretical" and spec.get("band"):
            lo, hi = spec["band"]
            axes.fill_between(xs, [lo * gbps / x for x in xs], [hi * gbps / x for x in xs], color="#d62728",
                              alpha=0.08, label="%d-%d%% of it (published runs)" % (lo * 100, hi * 100))
    for point in spec.get("points") or []:
        style = STYLES.get(point.get("kind"), STYLES["measured"])
        axes.scatter([float(point["gb_per_token"])], [float(point["tps"])], marker=style["marker"], s=style["size"],
                     color=style["color"], edgecolors="black", linewidths=0.5, zorder=3,
                     label="%s: %.1f tok/s" % (point["label"], float(point["tps"])))
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlim(low, high)
    for axis in (axes.xaxis, axes.yaxis):
        axis.set_major_formatter(FormatStrFormatter("%g"))
        # a range under about a decade has no labelled major tick: label the minor ones then
        axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1.2, 0.6)))
    axes.set_xlabel("routed-expert GB read per generated token")
    axes.set_ylabel("generation, tokens/s")
    axes.set_title(spec.get("title") or "Roofline", fontsize=11)
    if spec.get("note"):
        axes.text(0.01, 0.01, spec["note"], transform=axes.transAxes, fontsize=8, color="#d62728", va="bottom")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8, loc="upper right")
    figure.tight_layout()
    figure.savefig(path, format="png", metadata={"Software": None})


def main():
    module = AnsibleModule(
        argument_spec={"spec": {"type": "dict", "required": True}, "path": {"type": "path", "required": True},
                       "width_px": {"type": "int", "default": 1000}, "height_px": {"type": "int", "default": 650}},
        supports_check_mode=True)
    refusals = spec_refusals(module.params["spec"])
    if refusals:
        module.fail_json(msg="refused, no chart drawn: " + " | ".join(refusals), refusals=refusals)
    path = module.params["path"]
    directory = os.path.dirname(os.path.abspath(path))
    handle, scratch = tempfile.mkstemp(prefix=".roofline-", suffix=".png", dir=directory)
    os.close(handle)
    try:
        try:
            draw(module.params["spec"], scratch, module.params["width_px"], module.params["height_px"])
        except ImportError as exc:
            module.warn("no roofline chart: matplotlib is not importable by %s (%s); install the kit's requirements.txt"
                        % (os.sys.executable, exc))
            module.exit_json(changed=False, available=False, reason="matplotlib is not installed: %s" % exc)
        with open(scratch, "rb") as new:
            content = new.read()
        old = None
        if os.path.exists(path):
            with open(path, "rb") as current:
                old = current.read()
        changed = old != content
        if changed and not module.check_mode:
            os.chmod(scratch, 0o644)
            module.atomic_move(scratch, path)
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    module.exit_json(changed=changed, available=True, path=path)


if __name__ == "__main__":
    main()
