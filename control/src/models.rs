//! Resident models from an OpenAI-style `GET /v1/models`.
//!
//! vLLM lists its base model and every LoRA adapter it has loaded as
//! `data[]` entries; an adapter's `parent` names its base (when it was
//! registered with a base model name). Every id is resident, so every id
//! is warm; the running adapters `vllm:lora_requests_info` names (read
//! with the load, see `load.rs`) are added to them. A failed fetch keeps
//! the last good list, like load.

use serde::Deserialize;

#[derive(Deserialize)]
struct List {
    data: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    id: String,
    #[serde(default)]
    parent: Option<String>,
}

/// The model ids in a `/v1/models` body, bases and adapters, sorted.
pub fn read(body: &[u8]) -> Result<Vec<String>, String> {
    let list: List = serde_json::from_slice(body)
        .map_err(|e| format!("not an OpenAI model list (`{{\"data\":[{{\"id\":...}}]}}`): {e}"))?;
    let mut ids = Vec::with_capacity(list.data.len());
    for (i, e) in list.data.into_iter().enumerate() {
        if e.id.is_empty() || e.id.len() > ace_snapshot::MAX_NAME {
            return Err(format!(
                "`data[{i}].id` is empty or longer than {} bytes",
                ace_snapshot::MAX_NAME
            ));
        }
        if e.parent.as_deref() == Some("") {
            return Err(format!("`data[{i}].parent` is empty"));
        }
        ids.push(e.id);
    }
    ids.sort();
    ids.dedup();
    if ids.len() > ace_snapshot::MAX_WARM {
        return Err(format!(
            "{} models, above the snapshot's limit of {}",
            ids.len(),
            ace_snapshot::MAX_WARM
        ));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bases_and_adapters() {
        let body = br#"{"object":"list","data":[
            {"id":"meta-llama/Llama-2-7b-hf","object":"model","parent":null,"root":"/m"},
            {"id":"sql-lora","object":"model","parent":"meta-llama/Llama-2-7b-hf"}]}"#;
        assert_eq!(
            read(body).unwrap(),
            vec!["meta-llama/Llama-2-7b-hf".to_string(), "sql-lora".into()]
        );
    }

    #[test]
    fn a_real_vllm_answer_lists_its_base_and_adapter() {
        // vLLM's OpenAI server, a base model and a LoRA adapter
        // (tests/fixtures/README.md cites the version).
        let body = fixture!("vllm-models.json").as_bytes();
        assert_eq!(
            read(body).unwrap(),
            vec![
                "meta-llama/Llama-3.1-8B-Instruct".to_string(),
                "sql-lora".into()
            ]
        );
        // Its 401 body (started with --api-key, asked without it) is not
        // a list.
        let body = fixture!("vllm-models-401.json").as_bytes();
        assert!(read(body).is_err());
    }

    #[test]
    fn malformed_lists_name_the_problem() {
        assert!(read(b"[]")
            .unwrap_err()
            .contains("not an OpenAI model list"));
        assert!(read(br#"{"data":[{"id":""}]}"#)
            .unwrap_err()
            .contains("data[0].id"));
    }
}
