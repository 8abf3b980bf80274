//! The GPT-2 byte-to-symbol map of byte-level BPE (TOKENIZER.md §6).
//!
//! Bytes `!`..=`~`, `¡`..=`¬` and `®`..=`ÿ` stand for themselves; the other 68 bytes, in
//! increasing order, become U+0100, U+0101, … (so space is `Ġ`, LF is `Ċ`).

/// `BYTE_TO_CHAR[b]` is the symbol that spells byte `b` in vocab and merge strings.
pub const BYTE_TO_CHAR: [char; 256] = byte_to_char();

const fn prints_as_itself(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

const fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next_remapped = 0x100u32;
    let mut b = 0usize;
    while b < 256 {
        table[b] = if prints_as_itself(b as u8) {
            match char::from_u32(b as u32) {
                Some(c) => c,
                None => panic!("byte is a scalar value"),
            }
        } else {
            let c = match char::from_u32(next_remapped) {
                Some(c) => c,
                None => panic!("U+0100.. are scalar values"),
            };
            next_remapped += 1;
            c
        };
        b += 1;
    }
    table
}

/// The byte a symbol stands for, or `None` if `c` is not one of the 256 symbols.
pub fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    match cp {
        0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => Some(cp as u8),
        0x100..=0x143 => Some(REMAPPED_BYTES[(cp - 0x100) as usize]),
        _ => None,
    }
}

/// The 68 bytes that are remapped to U+0100.., in order.
const REMAPPED_BYTES: [u8; 68] = remapped_bytes();

const fn remapped_bytes() -> [u8; 68] {
    let mut out = [0u8; 68];
    let mut n = 0;
    let mut b = 0usize;
    while b < 256 {
        if !prints_as_itself(b as u8) {
            out[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    out
}

/// Decodes a token string the way the HF `ByteLevel` decoder does: if every character is a
/// byte symbol, the bytes they stand for; otherwise (e.g. `<｜User｜>`) the string's own UTF-8.
pub fn token_bytes(token: &str) -> Vec<u8> {
    token
        .chars()
        .map(char_to_byte)
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| token.as_bytes().to_vec())
}

/// Spells `bytes` in byte symbols (used to look up merge and vocab strings).
pub fn bytes_to_symbols(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| BYTE_TO_CHAR[b as usize]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_examples() {
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_TO_CHAR[0], '\u{100}');
        assert_eq!(BYTE_TO_CHAR[0xAD], '\u{143}');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(BYTE_TO_CHAR[b as usize]), Some(b));
        }
        assert_eq!(char_to_byte('｜'), None);
        assert_eq!(token_bytes("ĠÑĤ"), vec![b' ', 0xD1, 0x82]);
        assert_eq!(token_bytes("<｜User｜>"), "<｜User｜>".as_bytes());
    }
}
