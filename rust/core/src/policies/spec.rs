//! Plain-data description of a plugin's arguments (`pluginConfig[].args`): the one source
//! for the Python configuration loader (names, types, defaults, bounds) and for checking
//! the numeric arguments handed to [`super::build`].

/// Value type of an argument as written in YAML.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Int,
    Float,
    Bool,
    Str,
    /// A mapping of non-empty strings to non-empty strings.
    Map,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Int => "int",
            Kind::Float => "float",
            Kind::Bool => "bool",
            Kind::Str => "str",
            Kind::Map => "map",
        }
    }
}

/// Default of an argument. `Absent` means no value: our behaviour applies (documented
/// per argument), not a number.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Absent,
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(&'static str),
    EmptyMap,
}

impl Value {
    /// The value as the policies read it (booleans 0/1); None for non-numbers.
    pub fn number(self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(i as f64),
            Value::Float(f) => Some(f),
            Value::Bool(b) => Some(if b { 1.0 } else { 0.0 }),
            _ => None,
        }
    }
}

/// Who reads the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// The policy itself, in the scorer: passed to [`super::build`].
    Policy,
    /// The router around the scorer (prefix hashing, tokenizers, KV events): never passed
    /// to the scorer, which accepts it silently.
    Router,
}

/// One argument of one plugin.
#[derive(Clone, Copy, Debug)]
pub struct ArgSpec {
    /// Kthena's spelling (camelCase), as in `pluginConfig[].args`.
    pub name: &'static str,
    /// The field name on the Python side (snake_case).
    pub field: &'static str,
    pub kind: Kind,
    pub default: Value,
    pub min: Option<f64>,
    /// A value outside [min, max] refuses the configuration. Kthena silently falls back
    /// to the default for its integers; an ignored setting is worse than a refused file.
    pub max: Option<f64>,
    /// Kthena's own argument (true) or one of ours.
    pub kthena: bool,
    pub reader: Reader,
    /// For `Map`: the values are file paths, relative ones resolved against the directory
    /// of the configuration file.
    pub paths: bool,
}

impl ArgSpec {
    const fn new(name: &'static str, field: &'static str, kind: Kind, default: Value) -> Self {
        ArgSpec {
            name,
            field,
            kind,
            default,
            min: None,
            max: None,
            kthena: true,
            reader: Reader::Policy,
            paths: false,
        }
    }

    pub const fn int(name: &'static str, field: &'static str, default: Value) -> Self {
        Self::new(name, field, Kind::Int, default)
    }

    pub const fn float(name: &'static str, field: &'static str, default: f64) -> Self {
        Self::new(name, field, Kind::Float, Value::Float(default))
    }

    pub const fn bool(name: &'static str, field: &'static str, default: bool) -> Self {
        Self::new(name, field, Kind::Bool, Value::Bool(default))
    }

    pub const fn str(name: &'static str, field: &'static str, default: &'static str) -> Self {
        Self::new(name, field, Kind::Str, Value::Str(default))
    }

    /// A mapping of names to file paths.
    pub const fn path_map(name: &'static str, field: &'static str) -> Self {
        let mut s = Self::new(name, field, Kind::Map, Value::EmptyMap);
        s.paths = true;
        s
    }

    /// A positive integer.
    pub const fn positive(mut self) -> Self {
        self.min = Some(1.0);
        self
    }

    /// A TCP port (1..=65535).
    pub const fn port(mut self) -> Self {
        self.min = Some(1.0);
        self.max = Some(65535.0);
        self
    }

    /// Refused outside [min, max].
    pub const fn range(mut self, min: f64, max: f64) -> Self {
        self.min = Some(min);
        self.max = Some(max);
        self
    }

    /// One of our arguments, not Kthena's.
    pub const fn ours(mut self) -> Self {
        self.kthena = false;
        self
    }

    /// Read by the router around the scorer, not by the policy.
    pub const fn router(mut self) -> Self {
        self.reader = Reader::Router;
        self
    }

    /// Check a numeric value handed to the scorer (booleans 0/1).
    pub fn check(&self, v: f64) -> Result<(), String> {
        let n = self.name;
        let whole = v.is_finite() && v.fract() == 0.0;
        match self.kind {
            Kind::Int if !whole => return Err(format!("{n} must be an integer, got {v}")),
            Kind::Bool if v != 0.0 && v != 1.0 => {
                return Err(format!("{n} must be true or false, got {v}"))
            }
            Kind::Str | Kind::Map => return Err(format!("{n} is not a number")),
            _ => {}
        }
        let lo = self.min.unwrap_or(f64::NEG_INFINITY);
        let hi = self.max.unwrap_or(f64::INFINITY);
        // NaN fails the comparison.
        if !(v.is_finite() && lo <= v && v <= hi) {
            return Err(match (self.min, self.max) {
                (Some(lo), Some(hi)) => format!("{n} must be in [{lo}, {hi}], got {v}"),
                (Some(lo), None) => format!("{n} must be >= {lo}, got {v}"),
                (None, Some(hi)) => format!("{n} must be <= {hi}, got {v}"),
                (None, None) => format!("{n} must be finite, got {v}"),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_by_kind_and_bounds() {
        let i = ArgSpec::int("n", "n", Value::Int(3)).positive();
        assert!(i.check(2.0).is_ok());
        assert!(i.check(0.0).unwrap_err().contains(">= 1"));
        assert!(i.check(1.5).unwrap_err().contains("integer"));
        let f = ArgSpec::float("f", "f", 0.5).range(0.0, 1.0);
        assert!(f.check(1.0).is_ok());
        assert!(f.check(f64::NAN).is_err());
        assert!(f.check(1.5).unwrap_err().contains("[0, 1]"));
        assert!(ArgSpec::bool("b", "b", false).check(2.0).is_err());
        assert!(ArgSpec::str("s", "s", "x").check(1.0).is_err());
        assert_eq!(Value::Bool(true).number(), Some(1.0));
        assert_eq!(Value::Absent.number(), None);
    }
}
