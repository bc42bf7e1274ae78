//! Random passwords for the servers the test command starts.

use std::io::Read as _;

/// 32 hexadecimal digits from the kernel's random source: safe in a URL, a
/// shell word and an SQL string literal alike.
pub(crate) fn random_password() -> Result<String, String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .map_err(|e| format!("read /dev/urandom: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
