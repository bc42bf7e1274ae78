//! An outgoing message's headers as the outbox stores them: a count, then
//! each name and value with its length, as bytes (no dependency on a
//! serialization format; nothing stored when there are none).

/// `headers` as bytes: empty for none, else a version byte (1), the count
/// and each name and value as a 4-byte big-endian length and its bytes.
pub(crate) fn encode(headers: &[(String, String)]) -> Vec<u8> {
    if headers.is_empty() {
        return Vec::new();
    }
    let mut bytes = vec![1];
    push_len(&mut bytes, headers.len());
    for (name, value) in headers {
        push_len(&mut bytes, name.len());
        bytes.extend_from_slice(name.as_bytes());
        push_len(&mut bytes, value.len());
        bytes.extend_from_slice(value.as_bytes());
    }
    bytes
}

/// The headers [`encode`] wrote, or what is wrong with `bytes`.
pub(crate) fn decode(bytes: &[u8]) -> Result<Vec<(String, String)>, String> {
    let Some((&version, mut rest)) = bytes.split_first() else {
        return Ok(Vec::new());
    };
    if version != 1 {
        return Err(format!("stored headers have an unknown version {version}"));
    }
    let count = take_len(&mut rest)?;
    let mut headers = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        let name = take_text(&mut rest)?;
        let value = take_text(&mut rest)?;
        headers.push((name, value));
    }
    if !rest.is_empty() {
        return Err("stored headers have trailing bytes".to_owned());
    }
    Ok(headers)
}

fn push_len(bytes: &mut Vec<u8>, len: usize) {
    // Names and values are checked to fit (`OutgoingMessage`'s limits).
    bytes.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
}

fn take_len(rest: &mut &[u8]) -> Result<usize, String> {
    let Some((len, tail)) = rest.split_first_chunk::<4>() else {
        return Err("stored headers end inside a length".to_owned());
    };
    *rest = tail;
    Ok(u32::from_be_bytes(*len) as usize)
}

fn take_text(rest: &mut &[u8]) -> Result<String, String> {
    let len = take_len(rest)?;
    if rest.len() < len {
        return Err("stored headers end inside a name or value".to_owned());
    }
    let (text, tail) = rest.split_at(len);
    *rest = tail;
    String::from_utf8(text.to_vec()).map_err(|_| "stored headers are not UTF-8".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let headers = vec![
            ("traceparent".to_owned(), "00-abc-def-01".to_owned()),
            ("kind".to_owned(), String::new()),
            ("é".to_owned(), "ü".to_owned()),
        ];
        assert_eq!(decode(&encode(&headers)).unwrap(), headers);
        assert!(encode(&[]).is_empty());
        assert_eq!(decode(&[]).unwrap(), Vec::<(String, String)>::new());
    }

    #[test]
    fn damaged_headers_are_an_error_not_a_panic() {
        let bytes = encode(&[("a".to_owned(), "b".to_owned())]);
        for len in 1..bytes.len() {
            assert!(decode(&bytes[..len]).is_err(), "cut at {len}");
        }
        assert!(decode(&[2, 0, 0, 0, 0]).is_err());
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode(&long).is_err());
        assert!(decode(&[1, 0xFF, 0xFF, 0xFF, 0xFF]).is_err());
    }
}
