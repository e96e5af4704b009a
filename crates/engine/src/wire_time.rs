//! Unix milliseconds to the RFC 3339 text the wire uses for `apply_after`, without a clock crate.

use crate::records::Millis;

/// The instants the wire's text can name: four-digit years, from 0001 (PostgreSQL has no year 0)
/// to 9999. A write delayed to another would be refused by the server with its whole request.
pub const WIRE_TIMES: std::ops::RangeInclusive<Millis> = -62_135_596_800_000..=253_402_300_799_999;

/// Formats `ms` as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC); `ms` within `WIRE_TIMES`.
pub fn rfc3339(ms: Millis) -> String {
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    let (h, m, s, milli) = (in_day / 3_600_000, in_day / 60_000 % 60, in_day / 1000 % 60, in_day % 1000);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 to a proleptic Gregorian date.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_767_225_599_999), "2025-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(*super::WIRE_TIMES.start()), "0001-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(*super::WIRE_TIMES.end()), "9999-12-31T23:59:59.999Z");
    }
}
