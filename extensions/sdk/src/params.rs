//! How the SDK reads a request's params: the one rule both the dispatcher (protocol methods)
//! and the builder (custom methods) apply.
//!
//! A leaf: it knows the protocol's parser and nothing of the SDK's other modules.

use conduit_protocol::RpcError;
use serde::de::DeserializeOwned;

/// Read params as `P`; absent params read as `{}` (§3.1). Protocol methods take objects only
/// (the protocol's one parser, `conduit_protocol::parse_params`); a custom method's handler
/// decides for itself, so an array may reach it.
pub(crate) fn parse_params<P: DeserializeOwned>(
    method: &str,
    params: Option<&str>,
    object_only: bool,
) -> Result<P, RpcError> {
    if object_only {
        return conduit_protocol::parse_params(method, params);
    }
    let raw = params.unwrap_or("{}");
    serde_json::from_str(raw).map_err(|e| RpcError::invalid_params(method, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use conduit_protocol::ErrorCode;

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Opt {
        n: Option<u32>,
    }

    #[test]
    fn absent_params_read_as_an_empty_object_either_way() {
        for object_only in [true, false] {
            let p: Opt = parse_params("m", None, object_only).unwrap();
            assert_eq!(p, Opt { n: None });
        }
    }

    #[test]
    fn protocol_methods_take_objects_only_custom_methods_decide() {
        let err = parse_params::<Vec<u32>>("m", Some("[1, 2]"), true).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParams.number());
        let p: Vec<u32> = parse_params("m", Some("[1, 2]"), false).unwrap();
        assert_eq!(p, [1, 2]);
    }

    #[test]
    fn a_mismatch_is_invalid_params_naming_the_method() {
        for object_only in [true, false] {
            let err =
                parse_params::<Opt>("notes.echo", Some(r#"{"n":"x"}"#), object_only).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidParams.number());
            assert!(err.message.contains("`notes.echo`"), "{}", err.message);
        }
    }
}
