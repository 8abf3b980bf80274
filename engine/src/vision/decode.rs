//! Image bytes → 8-bit RGB, as the official pipeline's `Image.open(...).convert("RGB")` does
//! with Pillow (PngImagePlugin's mode table, Unpack.c, Convert.c). PNG only: every PNG colour
//! type and bit depth, interlaced or not. Per PNG colour type and bit depth:
//!
//! * greyscale 1/2/4/8 bits: the sample scaled to 8 bits (×255, ×85, ×17, ×1), copied to R, G, B;
//! * greyscale 16 bits: Pillow opens it as mode `I;16` and `convert("RGB")` **clamps** the value
//!   to 255 (`min(v, 255)`), it does not scale it: a 16-bit photograph comes out nearly white;
//! * RGB, greyscale+alpha and RGBA at 16 bits: the high byte of each sample;
//! * palette: the PLTE entry; an index beyond the PLTE's entries is black (0, 0, 0);
//! * alpha (a channel or tRNS) is dropped, never composited; gAMA, cHRM, sRGB, iCCP and eXIf
//!   change nothing.
//!
//! JPEG and the other formats Pillow reads are refused by name: decoders of lossy formats
//! differ in their last bits (goldens/ERRATA.md, `vision_image_decoding`;
//! 16-bit grey: `vision_grey16_clamp`).

use std::io::Cursor;
use std::path::Path;

use super::resample::RgbImage;
use crate::{Error, Result};

/// The most pixels an image may have: Pillow refuses more than twice its
/// `Image.MAX_IMAGE_PIXELS` (89,478,485) with a `DecompressionBombError`, so the official
/// pipeline cannot take a larger image either.
pub const MAX_IMAGE_PIXELS: u64 = 2 * 89_478_485;

/// The most bytes an image file may have before it is read.
pub const MAX_IMAGE_FILE_BYTES: u64 = 1 << 30;

fn image_err(file: &Path, reason: impl Into<String>) -> Error {
    Error::Image {
        file: file.to_path_buf(),
        reason: reason.into(),
    }
}

/// The format a file's first bytes announce, for a refusal that names it.
fn sniff(bytes: &[u8]) -> Option<&'static str> {
    const SIGNATURES: [(&[u8], &str); 8] = [
        (b"\x89PNG\r\n\x1a\n", "PNG"),
        (b"\xff\xd8\xff", "JPEG"),
        (b"GIF87a", "GIF"),
        (b"GIF89a", "GIF"),
        (b"BM", "BMP"),
        (b"II*\0", "TIFF"),
        (b"MM\0*", "TIFF"),
        (b"\0\0\0\x0cjP  ", "JPEG 2000"),
    ];
    if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        return Some("WebP");
    }
    SIGNATURES
        .iter()
        .find(|(magic, _)| bytes.starts_with(magic))
        .map(|&(_, name)| name)
}

/// Decode an image file's bytes to RGB exactly as Pillow's `convert("RGB")` sees it.
/// `file` names the source in errors; `max_pixels` bounds width × height before anything is
/// allocated.
pub fn decode_rgb(bytes: &[u8], file: &Path, max_pixels: u64) -> Result<RgbImage> {
    match sniff(bytes) {
        Some("PNG") => decode_png(bytes, file, max_pixels),
        Some(other) => Err(image_err(
            file,
            format!(
                "{other} images are not supported: only PNG decodes identically to Pillow \
                 (convert it to PNG with the decoder you trust)"
            ),
        )),
        None => Err(image_err(
            file,
            "not a PNG file (unrecognised signature; only PNG is supported)",
        )),
    }
}

fn decode_png(bytes: &[u8], file: &Path, max_pixels: u64) -> Result<RgbImage> {
    let png_err = |e: png::DecodingError| image_err(file, format!("corrupt PNG: {e}"));
    let mut decoder = png::Decoder::new(Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::IDENTITY);
    let header = decoder.read_header_info().map_err(png_err)?;
    let (width, height) = (header.width as u64, header.height as u64);
    if width * height > max_pixels {
        return Err(image_err(
            file,
            format!(
                "{width}x{height} is {} pixels, more than the {max_pixels} allowed \
                 (Pillow refuses such an image as a decompression bomb)",
                width * height
            ),
        ));
    }
    let mut reader = decoder.read_info().map_err(png_err)?;
    if reader.info().animation_control.is_some() {
        return Err(image_err(
            file,
            "animated PNG (APNG) is not supported: which frame Pillow shows depends on the \
             animation chunks",
        ));
    }
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| image_err(file, "PNG too large to decode"))?;
    let mut raw = vec![0u8; size];
    let frame = reader.next_frame(&mut raw).map_err(png_err)?;
    let info = reader.info();
    let (w, h) = (width as usize, height as usize);
    let depth = frame.bit_depth as u8;
    let line = frame.line_size;
    let mut rgb = Vec::with_capacity(w * h * 3);
    match frame.color_type {
        png::ColorType::Grayscale => {
            for y in 0..h {
                let row = &raw[y * line..][..line];
                for x in 0..w {
                    let v = grey_to_8bit(row, x, depth);
                    rgb.extend_from_slice(&[v, v, v]);
                }
            }
        }
        png::ColorType::Indexed => {
            let palette = info.palette.as_deref().unwrap_or(&[]);
            for y in 0..h {
                let row = &raw[y * line..][..line];
                for x in 0..w {
                    let i = packed_sample(row, x, depth) as usize;
                    // Pillow's palette has 256 entries; those the PLTE does not give are black.
                    let entry = palette.get(3 * i..3 * i + 3).unwrap_or(&[0, 0, 0]);
                    rgb.extend_from_slice(entry);
                }
            }
        }
        png::ColorType::Rgb | png::ColorType::Rgba | png::ColorType::GrayscaleAlpha => {
            let channels = frame.color_type.samples();
            let bytes_per_sample = if depth == 16 { 2 } else { 1 };
            for y in 0..h {
                let row = &raw[y * line..][..line];
                for x in 0..w {
                    // 16-bit samples are big-endian: the first byte is the high byte, the
                    // one Pillow's `;16B` unpackers keep.
                    let px = &row[x * channels * bytes_per_sample..];
                    let sample = |c: usize| px[c * bytes_per_sample];
                    if frame.color_type == png::ColorType::GrayscaleAlpha {
                        let v = sample(0);
                        rgb.extend_from_slice(&[v, v, v]);
                    } else {
                        rgb.extend_from_slice(&[sample(0), sample(1), sample(2)]);
                    }
                }
            }
        }
    }
    Ok(RgbImage {
        width: w,
        height: h,
        pixels: rgb,
    })
}

/// Sample `x` of a row of 1-, 2-, 4- or 8-bit samples packed most significant bit first.
fn packed_sample(row: &[u8], x: usize, depth: u8) -> u8 {
    match depth {
        8 => row[x],
        1 | 2 | 4 => {
            let per_byte = 8 / depth as usize;
            let shift = 8 - depth as usize * (x % per_byte + 1);
            (row[x / per_byte] >> shift) & ((1u8 << depth) - 1)
        }
        _ => unreachable!("PNG palette and greyscale depths are 1, 2, 4, 8 or 16"),
    }
}

/// A greyscale sample as Pillow's RGB conversion sees it (see the module comment).
fn grey_to_8bit(row: &[u8], x: usize, depth: u8) -> u8 {
    match depth {
        16 => {
            let v = u16::from_be_bytes([row[2 * x], row[2 * x + 1]]);
            v.min(255) as u8
        }
        // Scale the largest sample value to 255 (Unpack.c's `L;2` / `L;4`, and "1" → 255).
        d => packed_sample(row, x, d) * (255 / ((1u16 << d) - 1) as u8),
    }
}
