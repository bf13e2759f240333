//! The romfs checksum: the sum of big-endian 32-bit words, which must come
//! out as zero over a checked region (the writer stores the negated sum).

/// The wrapping sum of `bytes` read as big-endian 32-bit words. A trailing
/// partial word is padded with zero bytes.
pub fn word_sum(bytes: &[u8]) -> u32 {
    let mut chunks = bytes.chunks_exact(4);
    let mut sum = 0u32;
    for c in &mut chunks {
        sum = sum.wrapping_add(u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 4];
        w[..rest.len()].copy_from_slice(rest);
        sum = sum.wrapping_add(u32::from_be_bytes(w));
    }
    sum
}

/// The value to store in a checksum field (currently zero) so that
/// [`word_sum`] of the region becomes zero.
pub fn fix(region_with_zero_field: &[u8]) -> u32 {
    word_sum(region_with_zero_field).wrapping_neg()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_region_sums_to_zero() {
        let mut r = b"-rom1fs-\0\0\x02\0\0\0\0\0vol\0".to_vec();
        let c = fix(&r);
        r[12..16].copy_from_slice(&c.to_be_bytes());
        assert_eq!(word_sum(&r), 0);
    }

    #[test]
    fn partial_word_is_zero_padded() {
        assert_eq!(word_sum(&[0, 0, 0, 1, 0x80]), 1 + 0x8000_0000);
    }
}
