//! The report's charts: one inline SVG per timeline series, drawn with `plotters`, with a
//! labelled line at each phase change of the scenario and a legend.

use super::ChartError;
use super::at_secs;
use super::escape;
use super::figure;
use std::fmt::Write as _;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::prelude::*;

use crate::simulate::timeline::{Mark, Timeline};

/// One line of a chart: its legend and its points (seconds, value).
pub(super) struct Series {
    pub(super) name: String,
    pub(super) points: Vec<(f64, f64)>,
}

/// One chart: `counts` charts count things, so their axis has whole ticks only.
pub(super) struct Chart {
    pub(super) title: &'static str,
    pub(super) y_desc: &'static str,
    pub(super) counts: bool,
    pub(super) series: Vec<Series>,
}

/// The charts' titles, in page order (tests look for them).
pub const CHARTS: [&str; 6] = [
    "Pending pods",
    "Nodes by phase",
    "NodeClaims by phase",
    "Up-to-date nodes (NodePool status)",
    "Replica writes per MachineDeployment",
    "Cost per hour",
];

const WIDTH: u32 = 900;
/// The margin right of the plot that holds the legend.
const LEGEND_PX: u32 = 170;
const HEIGHT: u32 = 340;
/// Rows of phase labels above a chart's plot, so labels of phases close in time do not overlap.
const MARK_ROWS: i32 = 3;
const MARK_ROW_PX: i32 = 15;
const MARK_FONT_PX: i32 = 12;
/// A generous average glyph width of sans-serif at `MARK_FONT_PX`, to keep labels apart.
const MARK_CHAR_PX: i32 = 7;
/// Tableau's ten colours: told apart on white, none as pale as yellow.
const COLORS: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];

/// Every chart with its series.
pub(super) fn chart_data(t: &Timeline) -> Vec<Chart> {
    let secs: Vec<f64> = t.samples.iter().map(|s| s.at_ms as f64 / 1000.0).collect();
    let line = |name: &str, f: &dyn Fn(usize) -> f64| Series {
        name: name.to_string(),
        points: secs.iter().enumerate().map(|(i, x)| (*x, f(i))).collect(),
    };
    let s = &t.samples;
    let n = |v: usize| v as f64;
    let counts = |title, y_desc, series| Chart {
        title,
        y_desc,
        counts: true,
        series,
    };
    vec![
        counts(
            CHARTS[0],
            "pods",
            vec![line("pending", &|i| n(s[i].pending_pods))],
        ),
        counts(
            CHARTS[1],
            "nodes",
            vec![
                line("ready", &|i| n(s[i].nodes.ready)),
                line("not ready", &|i| n(s[i].nodes.not_ready)),
                line("terminating", &|i| n(s[i].nodes.terminating)),
            ],
        ),
        counts(
            CHARTS[2],
            "claims",
            vec![
                line("launching", &|i| n(s[i].claims.launching)),
                line("launched", &|i| n(s[i].claims.launched)),
                line("registered", &|i| n(s[i].claims.registered)),
                line("initialized", &|i| n(s[i].claims.initialized)),
                line("terminating", &|i| n(s[i].claims.terminating)),
            ],
        ),
        // The pools' own counts, so a rollout shows as a reader of `kubectl get nodepools` sees
        // it: up to date dips below all nodes at a template change and climbs back.
        counts(
            CHARTS[3],
            "nodes",
            vec![
                line("nodes", &|i| n(s[i].pool_status.nodes)),
                line("up to date", &|i| n(s[i].pool_status.up_to_date)),
            ],
        ),
        counts(
            CHARTS[4],
            "writes (cumulative)",
            t.replica_writes
                .iter()
                .map(|(md, counts)| line(md, &|i| n(counts.get(i).copied().unwrap_or(0))))
                .collect(),
        ),
        Chart {
            title: CHARTS[5],
            y_desc: "price units per hour",
            counts: false,
            series: vec![line("cost/h", &|i| s[i].cost_per_hour)],
        },
    ]
}

/// Ticks from 0 past `max` (about six of them) on a 1-2-5 step; whole steps only for counts.
/// Odd maxima (NaN, zero, negative) get the ticks of 1.
pub(super) fn ticks(max: f64, whole: bool) -> Vec<f64> {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let raw = max / 6.0;
    let decade = 10f64.powf(raw.log10().floor());
    let mut step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * decade)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * decade);
    if whole {
        step = step.max(1.0).round();
    }
    let n = (max / step).ceil().max(1.0) as usize;
    (0..=n).map(|i| i as f64 * step).collect()
}

/// A linear axis from 0 to `end` with exactly the given ticks (plotters' own float axis picks
/// its ticks itself, fractional ones for small counts among them).
pub(super) struct Ticked {
    pub(super) end: f64,
    pub(super) ticks: Vec<f64>,
}

impl Ticked {
    /// Ending at its last tick, past `max`: room above the highest value.
    fn past(max: f64, whole: bool) -> Self {
        let ticks = ticks(max, whole);
        let end = ticks.last().copied().unwrap_or(1.0);
        Self { end, ticks }
    }

    /// Ending at `max` itself (time: the run's end is the chart's right edge).
    pub(super) fn to(max: f64) -> Self {
        let mut axis = Self::past(max, false);
        if max.is_finite() && max > 0.0 {
            axis.end = max;
            axis.ticks.retain(|t| *t <= max);
        }
        axis
    }
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let frac = if v.is_finite() { v / self.end } else { 0.0 };
        // `as` saturates: a value far off the axis stays at the chart's edge in i32.
        (f64::from(limit.0) + frac * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        // The ticks are the bold mesh lines; no light ones between them.
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        0.0..self.end
    }
}

/// Where a phase line and its label go, in the chart's pixels.
pub(super) struct Placed<'a> {
    pub(super) mark: &'a Mark,
    pub(super) x: i32,
    pub(super) row: i32,
    /// The label's anchor: to the right of the line, or to its left near the chart's edge.
    pub(super) right_of_line: bool,
}

/// Rows for the labels of `xs` (pixel positions of the phase lines, in time order): each label
/// goes in the first row where it overlaps no other, so phases close in time stay readable.
pub(super) fn place<'a>(marks: &'a [Mark], xs: &[i32], right_edge: i32) -> Vec<Placed<'a>> {
    let mut rows: Vec<Vec<(i32, i32)>> = vec![Vec::new(); MARK_ROWS as usize];
    marks
        .iter()
        .zip(xs)
        .enumerate()
        .map(|(i, (mark, &x))| {
            let width = mark.label.chars().count() as i32 * MARK_CHAR_PX + 4;
            let right_of_line = x + width <= right_edge;
            let span = if right_of_line {
                (x, x + width)
            } else {
                (x - width, x)
            };
            let free = |row: &Vec<(i32, i32)>| {
                row.iter()
                    .all(|(a, b)| span.1 + 4 <= *a || *b + 4 <= span.0)
            };
            let row = rows.iter().position(free).unwrap_or(i % MARK_ROWS as usize);
            rows[row].push(span);
            Placed {
                mark,
                x,
                row: row as i32,
                right_of_line,
            }
        })
        .collect()
}

/// The phase lines and labels as SVG, one group per phase, drawn over the plot. Groups go
/// top row first: a line only crosses labels of rows below its own, which are drawn after it
/// on a white halo, so a line passing behind a label leaves it legible.
fn phase_svg(placed: &[Placed], plot_bottom: i32) -> String {
    let row_y = |row: i32| 4 + MARK_FONT_PX + row * MARK_ROW_PX;
    let mut order: Vec<&Placed> = placed.iter().collect();
    order.sort_by_key(|p| p.row);
    let mut out = String::new();
    for p in order {
        let y = row_y(p.row);
        let (text_x, anchor) = if p.right_of_line {
            (p.x + 3, "start")
        } else {
            (p.x - 3, "end")
        };
        let label = escape(&p.mark.label);
        let _ = writeln!(
            out,
            "<g class=\"phase\" data-at-ms=\"{at}\"><title>{label} at {secs}</title>\
             <line x1=\"{x}\" y1=\"{top}\" x2=\"{x}\" y2=\"{plot_bottom}\" stroke=\"#444\" stroke-width=\"1\" stroke-dasharray=\"5 3\"/>\
             <text x=\"{text_x}\" y=\"{y}\" text-anchor=\"{anchor}\" font-family=\"sans-serif\" font-size=\"{MARK_FONT_PX}\" fill=\"#222\" stroke=\"#fff\" stroke-width=\"3\" paint-order=\"stroke\">{label}</text></g>",
            at = p.mark.at_ms,
            secs = at_secs(p.mark.at_ms),
            x = p.x,
            top = y + 3,
        );
    }
    out
}

pub(super) fn color(i: usize) -> RGBColor {
    let (r, g, b) = COLORS[i % COLORS.len()];
    RGBColor(r, g, b)
}

/// The legend, right of the plot in the margin kept for it (inside the plot it hid the lines;
/// plotters clips its own legend's box and swatches to the plot).
fn legend_svg(series: &[Series], plot_right: i32, plot_top: i32) -> String {
    let mut out = String::new();
    for (i, s) in series.iter().enumerate() {
        let RGBColor(r, g, b) = color(i);
        let y = plot_top + 8 + i as i32 * 18;
        let x = plot_right + 14;
        let _ = writeln!(
            out,
            "<g class=\"legend\"><line x1=\"{x}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"rgb({r},{g},{b})\" stroke-width=\"2\"/>\
             <text x=\"{}\" y=\"{y}\" dy=\"0.35em\" font-family=\"sans-serif\" font-size=\"13\" fill=\"#222\">{}</text></g>",
            x + 18,
            x + 24,
            escape(&s.name)
        );
    }
    out
}

/// One line chart as an SVG document, with a labelled dashed line per phase mark.
pub(super) fn chart(spec: &Chart, marks: &[Mark]) -> Result<String, ChartError> {
    let fail = |e: &dyn std::fmt::Display| ChartError {
        chart: spec.title.to_string(),
        reason: e.to_string(),
    };
    let points = || spec.series.iter().flat_map(|s| s.points.iter());
    let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
    let x_max = points()
        .map(|p| finite(p.0))
        .chain(marks.iter().map(|m| m.at_ms as f64 / 1000.0))
        .fold(0.0, f64::max);
    let y_max = points().map(|p| finite(p.1)).fold(0.0, f64::max);
    let x_axis = Ticked::to(x_max);
    // Headroom above the highest value, so the top line clears the legend's edge.
    let y_axis = Ticked::past(y_max * 1.1, spec.counts);
    let top = if marks.is_empty() {
        12
    } else {
        8 + MARK_ROWS * MARK_ROW_PX
    };
    let mut svg = String::new();
    let (xs, right_edge, plot_y) = {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let mut c = ChartBuilder::on(&root)
            .margin(12)
            .margin_top(top)
            .margin_right(LEGEND_PX)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(x_axis, y_axis)
            .map_err(|e| fail(&e))?;
        let label = |v: &f64| figure(*v);
        c.configure_mesh()
            .x_desc("seconds since the simulated cluster started")
            .y_desc(spec.y_desc)
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 13))
            .bold_line_style(BLACK.mix(0.12))
            .x_label_formatter(&label)
            .y_label_formatter(&label)
            .draw()
            .map_err(|e| fail(&e))?;
        for (i, s) in spec.series.iter().enumerate() {
            c.draw_series(LineSeries::new(
                s.points.iter().map(|&(x, y)| (finite(x), finite(y))),
                color(i).stroke_width(2),
            ))
            .map_err(|e| fail(&e))?;
        }
        let xs: Vec<i32> = marks
            .iter()
            .map(|m| c.backend_coord(&(m.at_ms as f64 / 1000.0, 0.0)).0)
            .collect();
        let (px, py) = c.plotting_area().get_pixel_range();
        root.present().map_err(|e| fail(&e))?;
        (xs, px.end, py)
    };
    let (plot_top, plot_bottom) = (plot_y.start, plot_y.end);
    let placed = place(marks, &xs, right_edge);
    let extra = phase_svg(&placed, plot_bottom) + &legend_svg(&spec.series, right_edge, plot_top);
    Ok(match svg.rfind("</svg>") {
        Some(end) => format!("{}{extra}{}", &svg[..end], &svg[end..]),
        None => svg,
    })
}

/// The SVG with a `<title>` as its first child (what screen readers and tooltips show).
pub(super) fn with_title(svg: &str, title: &str) -> String {
    match svg
        .find("<svg")
        .and_then(|at| svg[at..].find('>').map(|end| at + end + 1))
    {
        Some(end) => format!(
            "{}<title>{}</title>{}",
            &svg[..end],
            escape(title),
            &svg[end..]
        ),
        None => svg.to_string(),
    }
}
