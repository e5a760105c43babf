//! SVG written by hand: the charts need rectangles, lines, text and dots,
//! and a string of them keeps the layout (legends beside the data, never on
//! it) in our hands and the files small and diffable.

use std::fmt::Write as _;

/// Fonts most renderers have, in the order they are tried: the layout
/// guesses text widths from DejaVu Sans's, the usual Linux default.
const FONT: &str = "DejaVu Sans, Helvetica, Arial, sans-serif";
/// Labels, titles and axes.
pub const INK: &str = "#222222";
/// Subtitles and secondary labels.
pub const MUTED: &str = "#666666";
/// Grid lines, faint enough to sit behind the data.
const GRID: &str = "#e3e3e3";
/// How light the pale half of a pair of bars is (its fill's opacity).
pub const PALE: f64 = 0.35;

/// Where a text's point is: at its start, middle or end.
#[derive(Debug, Clone, Copy)]
pub enum Anchor {
    /// The text starts at the point.
    Start,
    /// The text is centred on the point.
    Middle,
    /// The text ends at the point.
    End,
}

/// How a text is set.
#[derive(Debug, Clone, Copy)]
pub struct Font {
    /// Size in px.
    pub size: f64,
    /// Colour.
    pub color: &'static str,
    /// Bold or regular.
    pub bold: bool,
    /// Where the point is along the text.
    pub anchor: Anchor,
    /// A white outline, so that a line passing behind the text (a chart's
    /// reference line) does not cross it out.
    pub halo: bool,
}

impl Font {
    /// Regular text of `size` px in [`INK`], starting at its point.
    pub const fn new(size: f64) -> Self {
        Self {
            size,
            color: INK,
            bold: false,
            anchor: Anchor::Start,
            halo: false,
        }
    }

    /// The same, anchored at `anchor`.
    pub const fn at(self, anchor: Anchor) -> Self {
        Self { anchor, ..self }
    }

    /// The same, in `color`.
    pub const fn color(self, color: &'static str) -> Self {
        Self { color, ..self }
    }

    /// The same, bold.
    pub const fn bold(self) -> Self {
        Self { bold: true, ..self }
    }

    /// The same, outlined in white.
    pub const fn halo(self) -> Self {
        Self { halo: true, ..self }
    }
}

/// A legend's sample of what it names.
#[derive(Debug, Clone, Copy)]
pub enum Key {
    /// A line with a dot, in a colour.
    Line(&'static str),
    /// A bar in a colour, solid or pale.
    Bar(&'static str, bool),
    /// A thin dark tick across a bar.
    Tick,
    /// A dashed dark line.
    Dash,
}

/// An SVG document being drawn.
#[derive(Debug)]
pub struct Svg {
    width: f64,
    height: f64,
    body: String,
}

/// Escapes text for SVG.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// About how wide `text` is in px at `size`: DejaVu Sans averages a little
/// over 0.6 em, wider than most fonts, so the guess errs on the roomy side.
pub fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.62
}

impl Svg {
    /// An empty white page of `width` × `height` px.
    pub fn new(width: f64, height: f64) -> Self {
        let mut body = String::new();
        let _ = writeln!(
            body,
            r#"<rect width="{width}" height="{height}" fill="white"/>"#
        );
        Self {
            width,
            height,
            body,
        }
    }

    /// A rectangle filled with `color`, pale (with its outline solid) or not.
    pub fn bar(&mut self, (x, y): (f64, f64), (w, h): (f64, f64), color: &str, pale: bool) {
        let fill = if pale {
            format!(r#"fill="{color}" fill-opacity="{PALE}" stroke="{color}""#)
        } else {
            format!(r#"fill="{color}""#)
        };
        let _ = writeln!(
            self.body,
            r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{h:.1}" {fill}/>"#,
            w.max(0.0)
        );
    }

    /// A straight line, dashed or not.
    pub fn line(
        &mut self,
        from: (f64, f64),
        to: (f64, f64),
        color: &str,
        width: f64,
        dashed: bool,
    ) {
        let dash = if dashed {
            r#" stroke-dasharray="5 4""#
        } else {
            ""
        };
        let _ = writeln!(
            self.body,
            r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="{width}"{dash}/>"#,
            from.0, from.1, to.0, to.1
        );
    }

    /// A faint grid line.
    pub fn grid(&mut self, from: (f64, f64), to: (f64, f64)) {
        self.line(from, to, GRID, 1.0, false);
    }

    /// A line through `points` with a dot on each.
    pub fn series(&mut self, points: &[(f64, f64)], color: &str) {
        let path: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = writeln!(
            self.body,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2.5" stroke-linejoin="round"/>"#,
            path.join(" ")
        );
        for &(x, y) in points {
            let _ = writeln!(
                self.body,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="4" fill="{color}" stroke="white" stroke-width="1"/>"#
            );
        }
    }

    /// `text` at `(x, y)` (its baseline), rotated a quarter turn
    /// anticlockwise if `vertical` (for a y axis's title).
    pub fn text(&mut self, (x, y): (f64, f64), text: &str, font: Font, vertical: bool) {
        let anchor = match font.anchor {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        };
        let mut weight = if font.bold {
            r#" font-weight="bold""#
        } else {
            ""
        }
        .to_owned();
        if font.halo {
            weight.push_str(
                r#" stroke="white" stroke-width="4" stroke-linejoin="round" paint-order="stroke""#,
            );
        }
        let turn = if vertical {
            format!(r#" transform="rotate(-90 {x:.1} {y:.1})""#)
        } else {
            String::new()
        };
        let _ = writeln!(
            self.body,
            r#"<text x="{x:.1}" y="{y:.1}" font-family="{FONT}" font-size="{}" fill="{}" text-anchor="{anchor}"{weight}{turn}>{}</text>"#,
            font.size,
            font.color,
            escape(text)
        );
    }

    /// A legend entry: `key`'s sample, then `label`, starting at `(x, y)`
    /// (the middle of the line). Returns the entry's width.
    pub fn key(&mut self, (x, y): (f64, f64), key: Key, label: &str) -> f64 {
        match key {
            Key::Line(color) => self.series(&[(x, y), (x + 24.0, y)], color),
            Key::Bar(color, pale) => self.bar((x + 2.0, y - 6.0), (20.0, 12.0), color, pale),
            Key::Tick => {
                self.bar((x + 2.0, y - 6.0), (20.0, 12.0), "#bbbbbb", true);
                self.line((x + 12.0, y - 9.0), (x + 12.0, y + 9.0), INK, 2.0, false);
            }
            Key::Dash => self.line((x, y), (x + 24.0, y), INK, 1.5, true),
        }
        let font = Font::new(12.0);
        self.text((x + 30.0, y + 4.0), label, font, false);
        30.0 + text_width(label, font.size)
    }

    /// The finished document.
    pub fn finish(self) -> String {
        format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\">\n{}</svg>\n",
            self.body,
            w = self.width,
            h = self.height
        )
    }
}

/// Round steps (1, 2 or 5 × 10^k) from 0 to at least `max`, about `count`
/// of them.
pub fn linear_ticks(max: f64, count: usize) -> Vec<f64> {
    let max = if max > 0.0 && max.is_finite() {
        max
    } else {
        1.0
    };
    let rough = max / count.max(1) as f64;
    let power = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|s| *s >= rough)
        .unwrap_or(10.0 * power);
    let steps = (max / step - 1e-9).ceil().max(1.0) as usize;
    (0..=steps).map(|i| i as f64 * step).collect()
}

/// 1, 2 and 5 × 10^k from the last at or below `min` to the first at or
/// above `max`, for a log axis.
pub fn log_ticks(min: f64, max: f64) -> Vec<f64> {
    let min = min.max(1e-3);
    let mut tick = 10f64.powf(min.log10().floor());
    let mut ticks = Vec::new();
    for m in [1.0, 2.0, 5.0].iter().cycle() {
        let t = tick * m;
        if t <= min * (1.0 + 1e-9) {
            ticks.clear();
        }
        ticks.push(t);
        // Two at least, for an axis with some length even if every value
        // is the same.
        if t >= max * (1.0 - 1e-9) && ticks.len() > 1 {
            break;
        }
        if *m == 5.0 {
            tick *= 10.0;
        }
    }
    ticks
}

/// A tick label: `12k` for thousands, no needless decimals.
pub fn number(v: f64) -> String {
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s
        }
    };
    if v.abs() >= 1000.0 {
        format!("{}k", trim(format!("{:.1}", v / 1000.0)))
    } else {
        trim(format!("{v:.2}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_data() {
        assert_eq!(
            linear_ticks(11_201.0, 5),
            [0.0, 2500.0, 5000.0, 7500.0, 10_000.0, 12_500.0]
        );
        assert_eq!(linear_ticks(1.62, 4), [0.0, 0.5, 1.0, 1.5, 2.0]);
        assert_eq!(
            log_ticks(1.25, 61.7),
            [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(log_ticks(2.0, 20.0), [2.0, 5.0, 10.0, 20.0]);
        assert_eq!(log_ticks(0.0, 0.0), [0.001, 0.002]);
    }

    #[test]
    fn numbers_are_short() {
        assert_eq!(number(12_500.0), "12.5k");
        assert_eq!(number(10_000.0), "10k");
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(2.0), "2");
    }
}
