//! One AdmissionReview (`admission.k8s.io/v1`) in, its answer out: the webhook's decision,
//! pure (no IO, no clock), so every case is a unit test.
//!
//! Invariant: the answer always allows the pod. A review that cannot be read as one (but is
//! JSON) is allowed with a warning; a pod that cannot take the sidecar is allowed unchanged
//! with a warning saying why; only bytes that are not JSON are refused ([`NotJson`], 400).

use base64::Engine as _;
use serde_json::{Value, json};

use super::node::Node;
use super::patch;
use super::settings::{INJECT, SettingsArgs};
use super::sidecar::{self, Outcome};

/// Which pods a webhook path injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Pods annotated `ratekeeper.io/inject: enabled` (`/inject`).
    Annotated,
    /// Every pod not opted out: its namespace is labelled for injection (`/inject/namespace`).
    Namespace,
}

/// What the webhook did, for its metrics (`result` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Injected,
    Skipped,
    /// The pod asked for the sidecar but cannot take it (a bad annotation, a port clash).
    Refused,
    Malformed,
}

impl Decision {
    pub fn label(self) -> &'static str {
        match self {
            Decision::Injected => "injected",
            Decision::Skipped => "skipped",
            Decision::Refused => "refused",
            Decision::Malformed => "malformed",
        }
    }
}

/// The body was not JSON.
#[derive(Debug)]
pub struct NotJson(pub String);

/// The answer: the AdmissionReview to send back, and what was decided.
#[derive(Debug)]
pub struct Answer {
    pub review: Value,
    pub decision: Decision,
}

/// Answers one review body.
pub fn answer(body: &[u8], scope: Scope, settings: &SettingsArgs) -> Result<Answer, NotJson> {
    serde_json::from_slice::<serde::de::IgnoredAny>(body)
        .map_err(|error| NotJson(format!("the body is not JSON: {error}")))?;
    let review: Node = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(error) => return Ok(malformed("", &format!("unreadable review: {error}"))),
    };
    let Some(request) = review
        .get("request")
        .filter(|request| request.as_map().is_some())
    else {
        return Ok(malformed("", "no request in the review"));
    };
    let Some(uid) = request.str_at(&["uid"]) else {
        return Ok(malformed("", "request.uid: missing"));
    };
    if review.str_at(&["apiVersion"]) != Some("admission.k8s.io/v1")
        || review.str_at(&["kind"]) != Some("AdmissionReview")
    {
        return Ok(malformed(uid, "not an admission.k8s.io/v1 AdmissionReview"));
    }
    let skip = |why: &str| {
        tracing::debug!(uid, why, "pod not injected");
        Answer {
            review: response(uid, None, &[]),
            decision: Decision::Skipped,
        }
    };
    if request.str_at(&["kind", "kind"]) != Some("Pod") {
        return Ok(skip("not a pod"));
    }
    if request.str_at(&["operation"]) != Some("CREATE") {
        return Ok(skip("not a creation"));
    }
    let Some(pod) = request.get("object").filter(|pod| pod.as_map().is_some()) else {
        return Ok(malformed(uid, "request.object: not a pod"));
    };
    if sidecar::opted_out(pod) || sidecar::is_injected(pod) {
        return Ok(skip("opted out or injected already"));
    }
    let asked = sidecar::annotations(pod)
        .and_then(|annotations| annotations.get(INJECT))
        .and_then(Node::as_str)
        == Some("enabled");
    if scope == Scope::Annotated && !asked {
        return Ok(skip("not asked for"));
    }
    let mut injected = pod.clone();
    let settings = match sidecar::inject(&mut injected, settings) {
        Ok((Outcome::Injected, settings)) => settings,
        Ok(_) => return Ok(skip("opted out or injected already")),
        Err(problem) => {
            return Ok(Answer {
                review: response(uid, None, &[format!("ratekeeper: not injected: {problem}")]),
                decision: Decision::Refused,
            });
        }
    };
    let ops = patch::diff(pod, &injected);
    // Operations of strings, maps and lists always serialize.
    let ops = serde_json::to_vec(&ops).unwrap_or_default();
    let mut warnings = Vec::new();
    if settings.cluster {
        warnings.push(format!(
            "ratekeeper: cluster mode: the headless Service {} must select this pod (`ratekeeper inject` writes it)",
            settings.peers_service
        ));
    }
    Ok(Answer {
        review: response(uid, Some(&ops), &warnings),
        decision: Decision::Injected,
    })
}

fn malformed(uid: &str, problem: &str) -> Answer {
    Answer {
        review: response(
            uid,
            None,
            &[format!(
                "ratekeeper: malformed admission review, pod allowed unchanged: {problem}"
            )],
        ),
        decision: Decision::Malformed,
    }
}

/// An allowing AdmissionReview response, with a patch when given.
fn response(uid: &str, patch: Option<&[u8]>, warnings: &[String]) -> Value {
    let mut response = json!({"uid": uid, "allowed": true});
    if let Some(patch) = patch {
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(patch));
    }
    if !warnings.is_empty() {
        response["warnings"] = json!(warnings);
    }
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    })
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use serde_json::{Value, json};

    use super::{Decision, Scope, answer};
    use crate::settings::SettingsArgs;

    fn review(object: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": "CREATE",
                "object": object,
            }
        }))
        .expect("json")
    }

    fn pod(annotations: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": annotations},
               "spec": {"containers": [{"name": "app", "image": "app"}]}})
    }

    #[test]
    fn each_case_is_allowed_and_only_asked_for_pods_are_patched() {
        let settings = SettingsArgs::default();
        let decide = |body: &[u8], scope| answer(body, scope, &settings).expect("json");
        let enabled = review(pod(json!({"ratekeeper.io/inject": "enabled"})));
        let plain = review(pod(json!({})));
        let disabled = review(pod(json!({"ratekeeper.io/inject": "disabled"})));
        let bad = review(pod(
            json!({"ratekeeper.io/inject": "enabled", "ratekeeper.io/cluster": "maybe"}),
        ));
        for (body, scope, decision) in [
            (&enabled, Scope::Annotated, Decision::Injected),
            (&plain, Scope::Annotated, Decision::Skipped),
            (&plain, Scope::Namespace, Decision::Injected),
            (&disabled, Scope::Namespace, Decision::Skipped),
            (&bad, Scope::Annotated, Decision::Refused),
        ] {
            let answer = decide(body, scope);
            assert_eq!(
                answer.decision,
                decision,
                "{scope:?} {}",
                String::from_utf8_lossy(body)
            );
            assert_eq!(answer.review["response"]["allowed"], true);
            assert_eq!(answer.review["response"]["uid"], "u-1");
            let patched = answer.review["response"].get("patch").is_some();
            assert_eq!(patched, decision == Decision::Injected);
        }
        let injected = decide(&enabled, Scope::Annotated);
        let patch = base64::engine::general_purpose::STANDARD
            .decode(
                injected.review["response"]["patch"]
                    .as_str()
                    .expect("patch"),
            )
            .expect("base64");
        let ops: Value = serde_json::from_slice(&patch).expect("json patch");
        assert!(ops.as_array().is_some_and(|ops| !ops.is_empty()), "{ops}");
        // The native sidecar: the pod had no initContainers, the patch creates them.
        let init = ops
            .as_array()
            .into_iter()
            .flatten()
            .find(|op| op["path"] == "/spec/initContainers")
            .expect("initContainers added");
        assert_eq!(init["op"], "add");
        assert_eq!(init["value"][0]["restartPolicy"], "Always");
        for body in [&b"{}"[..], br#"{"request": {"uid": 7}}"#, br#"[1, 2]"#] {
            let answer = decide(body, Scope::Namespace);
            assert_eq!(answer.decision, Decision::Malformed);
            assert_eq!(answer.review["response"]["allowed"], true);
            assert!(answer.review["response"]["warnings"][0].is_string());
        }
        assert!(answer(b"\x00not json", Scope::Namespace, &settings).is_err());
    }
}
