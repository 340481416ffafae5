//! A JSON object whose keys keep the order they were measured in (serde_json's own map sorts
//! them), so that a result file reads in the order its table prints.

use serde::Serialize;
use serde::ser::SerializeMap;

/// Keys and values in insertion order; serialized as a JSON object.
#[derive(Debug, Clone)]
pub struct Ordered<T>(pub Vec<(String, T)>);

impl<T> Default for Ordered<T> {
    fn default() -> Self {
        Ordered(Vec::new())
    }
}

impl<T> Ordered<T> {
    /// Append `key` → `value`.
    pub fn push(&mut self, key: impl Into<String>, value: T) {
        self.0.push((key.into(), value));
    }

    /// The value of `key`, if any.
    pub fn get(&self, key: &str) -> Option<&T> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

impl<T: Serialize> Serialize for Ordered<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}
