//! The two chart layouts, horizontal bars by backend and lines across a
//! sweep. Both keep their legend outside the plot area, so that it never
//! hides a point, and label both axes.

use super::palette;
use super::svg::{Anchor, Font, INK, Key, MUTED, Svg, linear_ticks, log_ticks, number, text_width};

/// Every chart's width in px: room for the labels, and narrow enough for a
/// documentation's column without much shrinking.
const WIDTH: f64 = 800.0;
/// Space around the whole chart.
const MARGIN: f64 = 20.0;
/// A bar's thickness.
const TRACK: f64 = 18.0;
/// The space between two bars of one backend.
const TRACK_GAP: f64 = 4.0;
/// Space above and below a backend's bars.
const ROW_PAD: f64 = 12.0;

/// What every chart starts with.
#[derive(Debug)]
pub struct Titles<'a> {
    /// What the chart shows, in a line.
    pub title: &'a str,
    /// How it was measured, and which way is better.
    pub subtitle: &'a str,
    /// The legend: samples and what they stand for.
    pub legend: Vec<(Key, String)>,
}

/// One bar of a backend, on its own line of the chart: its bars are drawn
/// from the first, over each other, then `label` after the longest.
#[derive(Debug, Default)]
pub struct Track {
    /// Values and whether each is drawn pale.
    pub bars: Vec<(f64, bool)>,
    /// A dark mark across the bar at this value.
    pub tick: Option<f64>,
    /// Written after the bar.
    pub label: String,
}

/// Where the plot area starts: below the title and subtitle, and the
/// legend row if the chart has one.
fn plot_top(titles: &Titles<'_>) -> f64 {
    if titles.legend.is_empty() {
        72.0
    } else {
        100.0
    }
}

/// A title, a subtitle, and the legend row if there is one.
fn header(svg: &mut Svg, titles: &Titles<'_>) {
    let title = Font::new(17.0).bold();
    svg.text((MARGIN, 30.0), titles.title, title, false);
    let subtitle = Font::new(12.0).color(MUTED);
    svg.text((MARGIN, 50.0), titles.subtitle, subtitle, false);
    let mut x = MARGIN;
    for (key, label) in &titles.legend {
        x += svg.key((x, 76.0), *key, label) + 22.0;
    }
}

/// A chart with nothing to show says so, rather than leaving an older
/// run's chart in place.
pub fn empty(titles: &Titles<'_>) -> String {
    let mut svg = Svg::new(WIDTH, 140.0);
    header(
        &mut svg,
        &Titles {
            legend: Vec::new(),
            ..*titles
        },
    );
    let font = Font::new(14.0).color(MUTED);
    let text = "Nothing to draw from this run (the in-memory driver is in the tables only).";
    svg.text((MARGIN, 100.0), text, font, false);
    svg.finish()
}

/// Horizontal bars, one group per backend in the order given, on a linear
/// axis from 0 titled `x_title`, with a dashed line at `reference`.
pub fn bars(
    titles: &Titles<'_>,
    x_title: &str,
    reference: Option<f64>,
    rows: &[(&str, Vec<Track>)],
) -> String {
    let name_font = Font::new(13.0).bold().at(Anchor::End);
    let label_font = Font::new(12.0).halo();
    let names = rows
        .iter()
        .map(|(key, _)| text_width(palette::name(key), 13.0));
    let left = MARGIN + names.fold(70.0, f64::max) + 12.0;
    let plot_w = WIDTH - MARGIN - left;
    // The axis reaches far enough that every label fits after its bar.
    let mut reach = reference.unwrap_or(0.0);
    for track in rows.iter().flat_map(|(_, tracks)| tracks) {
        let end = track.bars.iter().map(|b| b.0).fold(0.0, f64::max);
        let room = plot_w - 8.0 - text_width(&track.label, label_font.size);
        reach = reach.max(end * plot_w / room.max(plot_w / 4.0));
    }
    let ticks = linear_ticks(reach, 5);
    let top = ticks.last().copied().unwrap_or(1.0);
    let x = |v: f64| left + v.max(0.0) / top * plot_w;
    let heights: Vec<f64> = rows
        .iter()
        .map(|(_, t)| t.len() as f64 * (TRACK + TRACK_GAP) - TRACK_GAP + 2.0 * ROW_PAD)
        .collect();
    let plot_top = plot_top(titles);
    let bottom = plot_top + heights.iter().sum::<f64>();
    let mut svg = Svg::new(WIDTH, bottom + 56.0);
    header(&mut svg, titles);
    for &t in &ticks {
        svg.grid((x(t), plot_top), (x(t), bottom));
        let font = Font::new(12.0).at(Anchor::Middle);
        svg.text((x(t), bottom + 17.0), &number(t), font, false);
    }
    // Behind the bars and their labels.
    if let Some(r) = reference {
        svg.line((x(r), plot_top - 6.0), (x(r), bottom), INK, 1.5, true);
    }
    let mut y = plot_top;
    for ((key, tracks), height) in rows.iter().zip(&heights) {
        let name_y = y + height / 2.0 + 4.5;
        svg.text((left - 10.0, name_y), palette::name(key), name_font, false);
        let color = palette::color(key);
        let mut track_y = y + ROW_PAD;
        for track in tracks {
            for &(value, pale) in &track.bars {
                svg.bar((left, track_y), (x(value) - left, TRACK), color, pale);
            }
            if let Some(tick) = track.tick {
                let (from, to) = ((x(tick), track_y - 3.0), (x(tick), track_y + TRACK + 3.0));
                svg.line(from, to, INK, 2.0, false);
            }
            let end = track.bars.iter().map(|b| b.0).fold(0.0, f64::max);
            let at = (x(end) + 6.0, track_y + TRACK / 2.0 + 4.0);
            svg.text(at, &track.label, label_font, false);
            track_y += TRACK + TRACK_GAP;
        }
        y += height;
    }
    svg.line((left, bottom), (left + plot_w, bottom), INK, 1.0, false);
    svg.line((left, plot_top), (left, bottom), INK, 1.0, false);
    let font = Font::new(13.0).at(Anchor::Middle);
    svg.text((left + plot_w / 2.0, bottom + 42.0), x_title, font, false);
    svg.finish()
}

/// How a line chart's y axis runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// From 0, evenly.
    Linear,
    /// By powers of ten, for figures that span them (latency percentiles).
    Log,
}

/// A line chart's x axis: where its labelled ticks are and how far it runs.
#[derive(Debug)]
pub struct XAxis<'a> {
    /// Its title, with the unit.
    pub title: &'a str,
    /// Labelled positions.
    pub ticks: Vec<(f64, String)>,
    /// The range shown.
    pub range: (f64, f64),
}

/// One line per backend, in the order given, with the backends' legend to
/// the right of the plot area (and any other above it, from `titles`).
pub fn lines(
    titles: &Titles<'_>,
    x_axis: &XAxis<'_>,
    (y_title, scale): (&str, Scale),
    series: &[(&str, Vec<(f64, f64)>)],
) -> String {
    let (height, plot_top) = (460.0, plot_top(titles));
    let legend_w = series
        .iter()
        .map(|(key, _)| 30.0 + text_width(palette::name(key), 12.0))
        .fold(90.0, f64::max);
    let (left, right, bottom) = (
        MARGIN + 62.0,
        WIDTH - MARGIN - legend_w - 24.0,
        height - 58.0,
    );
    let values = series.iter().flat_map(|(_, p)| p.iter().map(|p| p.1));
    let (lo, hi) = values.fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let ticks = match scale {
        Scale::Linear => linear_ticks(hi * 1.05, 5),
        Scale::Log => log_ticks(lo, hi),
    };
    let (first, last) = (ticks[0], ticks[ticks.len() - 1]);
    let y = |v: f64| {
        let share = match scale {
            Scale::Linear => v / last,
            Scale::Log => (v.max(first).log10() - first.log10()) / (last / first).log10(),
        };
        bottom - share * (bottom - plot_top)
    };
    let (x_lo, x_hi) = x_axis.range;
    let x = |v: f64| left + (v - x_lo) / (x_hi - x_lo) * (right - left);
    let mut svg = Svg::new(WIDTH, height);
    header(&mut svg, titles);
    let tick_font = Font::new(12.0);
    for &t in &ticks {
        svg.grid((left, y(t)), (right, y(t)));
        svg.text(
            (left - 8.0, y(t) + 4.0),
            &number(t),
            tick_font.at(Anchor::End),
            false,
        );
    }
    for (t, label) in &x_axis.ticks {
        svg.grid((x(*t), plot_top), (x(*t), bottom));
        let at = (x(*t), bottom + 17.0);
        svg.text(at, label, tick_font.at(Anchor::Middle), false);
    }
    svg.line((left, bottom), (right, bottom), INK, 1.0, false);
    svg.line((left, plot_top), (left, bottom), INK, 1.0, false);
    let title_font = Font::new(13.0).at(Anchor::Middle);
    let middle = (left + right) / 2.0;
    svg.text((middle, bottom + 42.0), x_axis.title, title_font, false);
    let y_at = (MARGIN + 6.0, (plot_top + bottom) / 2.0);
    svg.text(y_at, y_title, title_font, true);
    let mut legend_y = plot_top + 8.0;
    for (key, points) in series {
        let points: Vec<(f64, f64)> = points.iter().map(|&(px, py)| (x(px), y(py))).collect();
        svg.series(&points, palette::color(key));
        let sample = Key::Line(palette::color(key));
        svg.key((right + 24.0, legend_y), sample, palette::name(key));
        legend_y += 24.0;
    }
    svg.finish()
}
