//! The CLI's text tables: every column as wide as its widest cell (header included), two
//! spaces between columns, the last column not padded; so a long value (`ready, unresponsive`,
//! a long package name) widens its column instead of pushing the rest of its row out of line.
//!
//! A leaf: the listing commands call it; it knows nothing of what the cells mean. Widths count
//! characters, not bytes (`µs` is two), which is what a terminal shows for the text conduit
//! prints.

/// How a column's cells sit in their width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Align {
    Left,
    /// Numbers: right-aligned, so their digits line up.
    Right,
}

/// The table as text, one line per row after the header, each ending in a newline. A row
/// with fewer cells than there are headers leaves the rest empty.
pub(crate) fn render(headers: &[&str], align: &[Align], rows: &[Vec<String>]) -> String {
    let n = headers.len();
    let mut width: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().take(n).enumerate() {
            width[i] = width[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, w) in width.iter().enumerate() {
            let cell = row.get(i).map_or("", String::as_str);
            let pad = w - cell.chars().count();
            if i > 0 {
                line.push_str("  ");
            }
            let last = i + 1 == n;
            match align.get(i).copied().unwrap_or(Align::Left) {
                Align::Right => {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(cell);
                }
                Align::Left => {
                    line.push_str(cell);
                    if !last {
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                }
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let rows = vec![
            vec!["echo".into(), "ready".into(), "4242".into(), "-".into()],
            vec![
                "flaky".into(),
                "ready, unresponsive".into(),
                "17".into(),
                "exit code 3".into(),
            ],
            vec!["µ".into(), "disabled".into(), "-".into()],
        ];
        let text = render(
            &["NAME", "STATE", "PID", "LAST EXIT"],
            &[Align::Left, Align::Left, Align::Right, Align::Left],
            &rows,
        );
        assert_eq!(
            text,
            "NAME   STATE                 PID  LAST EXIT\n\
             echo   ready                4242  -\n\
             flaky  ready, unresponsive    17  exit code 3\n\
             µ      disabled                -\n"
        );
    }
}
