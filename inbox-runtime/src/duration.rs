//! Durations as people write them in configuration (`7d`, `36h`, `90m`):
//! the formatting half, which error messages use. Parsing, which reports
//! its errors as retention problems, is [`crate::retention::parse_duration`].

use std::time::Duration;

/// Formats a duration in the largest unit that divides it (`7d`, `36h`,
/// `90s`), the form [`parse_duration`](crate::retention::parse_duration) reads back.
///
/// ```
/// use std::time::Duration;
/// use inbox_runtime::retention::format_duration;
///
/// assert_eq!(format_duration(Duration::from_secs(7 * 86_400)), "7d");
/// assert_eq!(format_duration(Duration::from_secs(5_400)), "90m");
/// assert_eq!(format_duration(Duration::from_millis(1_500)), "1500ms");
/// ```
pub fn format_duration(duration: Duration) -> String {
    let micros = duration.as_micros();
    if micros == 0 {
        return "0s".to_owned();
    }
    const UNITS: [(u128, &str); 6] = [
        (86_400_000_000, "d"),
        (3_600_000_000, "h"),
        (60_000_000, "m"),
        (1_000_000, "s"),
        (1_000, "ms"),
        (1, "us"),
    ];
    for (size, unit) in UNITS {
        if micros % size == 0 {
            return format!("{}{unit}", micros / size);
        }
    }
    format!("{micros}us")
}
