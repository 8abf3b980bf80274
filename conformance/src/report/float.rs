//! Numbers in report.json and certificate.json (CONTRACT.md §8): JSON has no infinity or NaN,
//! and serde_json writes them as `null`, which then cannot be read back as a number. Every
//! `f64` of a report is therefore written as a JSON number when finite and as one of the
//! strings `"inf"`, `"-inf"`, `"nan"` otherwise (an infinite golden margin, a non-finite
//! engine value). Readers accept both forms, and `null` (reports written before contract
//! 1.2.0) as NaN: its sign and kind were lost when it was written.
//!
//! Use with `#[serde(with = "crate::report::float")]` on an `f64` field, or the `option`,
//! `vec_option` and `named_series` submodules for the composite shapes reports carry.

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// An `f64` with the encoding above.
#[derive(Debug, Clone, Copy)]
pub struct Real(pub f64);

impl Serialize for Real {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let x = self.0;
        if x.is_finite() {
            s.serialize_f64(x)
        } else if x.is_nan() {
            s.serialize_str("nan")
        } else if x > 0.0 {
            s.serialize_str("inf")
        } else {
            s.serialize_str("-inf")
        }
    }
}

impl<'de> Deserialize<'de> for Real {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Real, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Real;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(r#"a number or one of "inf", "-inf", "nan""#)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Real, E> {
                Ok(Real(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Real, E> {
                Ok(Real(v as f64))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Real, E> {
                Ok(Real(v as f64))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Real, E> {
                match v {
                    "inf" => Ok(Real(f64::INFINITY)),
                    "-inf" => Ok(Real(f64::NEG_INFINITY)),
                    "nan" => Ok(Real(f64::NAN)),
                    other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
                }
            }
            fn visit_unit<E: de::Error>(self) -> Result<Real, E> {
                Ok(Real(f64::NAN))
            }
        }
        d.deserialize_any(V)
    }
}

pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    Real(*x).serialize(s)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Real::deserialize(d).map(|r| r.0)
}

/// `Option<f64>`: `None` stays `null` only when the field is skipped or absent; a present
/// `null` reads as `None` as well.
pub mod option {
    use super::*;

    pub fn serialize<S: Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        x.map(Real).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        Ok(Option::<Real>::deserialize(d)?.map(|r| r.0))
    }
}

/// `Vec<Option<f64>>` (a per-layer series; `null` = nothing compared in that layer).
pub mod vec_option {
    use super::*;

    pub fn serialize<S: Serializer>(x: &[Option<f64>], s: S) -> Result<S::Ok, S::Error> {
        x.iter()
            .map(|v| v.map(Real))
            .collect::<Vec<_>>()
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Option<f64>>, D::Error> {
        Ok(Vec::<Option<Real>>::deserialize(d)?
            .into_iter()
            .map(|v| v.map(|r| r.0))
            .collect())
    }
}

/// `Vec<(String, Vec<Option<f64>>)>`: named per-layer series.
pub mod named_series {
    use super::*;

    type Series = Vec<(String, Vec<Option<f64>>)>;

    pub fn serialize<S: Serializer>(x: &Series, s: S) -> Result<S::Ok, S::Error> {
        x.iter()
            .map(|(n, v)| (n, v.iter().map(|y| y.map(Real)).collect::<Vec<_>>()))
            .collect::<Vec<_>>()
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Series, D::Error> {
        Ok(Vec::<(String, Vec<Option<Real>>)>::deserialize(d)?
            .into_iter()
            .map(|(n, v)| (n, v.into_iter().map(|y| y.map(|r| r.0)).collect()))
            .collect())
    }
}

/// The same value, bit for bit, or both NaN (NaN payloads are not kept: `"nan"` is one value).
pub fn same(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Serialize, Deserialize)]
    struct Probe {
        #[serde(with = "super")]
        x: f64,
        #[serde(with = "option")]
        o: Option<f64>,
    }

    #[test]
    fn non_finite_values_are_strings_and_read_back() {
        for v in [
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -0.0,
            1e-310,
            f64::MAX,
        ] {
            let p = Probe { x: v, o: Some(v) };
            let j = serde_json::to_string(&p).unwrap();
            assert!(!j.contains("null"), "{j}");
            let q: Probe = serde_json::from_str(&j).unwrap();
            assert!(same(q.x, v) && same(q.o.unwrap(), v), "{v} -> {j}");
        }
        let legacy: Probe = serde_json::from_str(r#"{"x":null,"o":null}"#).unwrap();
        assert!(legacy.x.is_nan() && legacy.o.is_none());
        assert!(serde_json::from_str::<Probe>(r#"{"x":"infinity","o":1}"#).is_err());
    }
}
