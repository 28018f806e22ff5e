//! The API keys this listener serves and their version windows: the one
//! table ApiVersions advertises and the connection checks every request
//! against (docs/KAFKA.md, "API keys").

use kafka_protocol::messages::api_versions_response::{ApiVersion, ApiVersionsResponse};
use kafka_protocol::messages::ApiKey;


/// (key, lowest, highest version served). Each window lies inside the
/// crate's own for that key.
const TABLE: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 6),
    (ApiKey::Metadata, 0, 9),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 7),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 4),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::DescribeCluster, 0, 1),
];

/// The window served for `key`, if it is served.
pub fn supported(key: ApiKey) -> Option<(i16, i16)> {
    TABLE.iter().find(|(k, _, _)| *k == key).map(|&(_, lo, hi)| (lo, hi))
}

/// The ApiVersions answer, with `error_code`.
pub fn answer(error_code: i16) -> ApiVersionsResponse {
    let mut r = ApiVersionsResponse::default();
    r.error_code = error_code;
    r.api_keys = TABLE
        .iter()
        .map(|&(key, lo, hi)| {
            let mut v = ApiVersion::default();
            v.api_key = key as i16;
            v.min_version = lo;
            v.max_version = hi;
            v
        })
        .collect();
    r.finalized_features_epoch = -1;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_window_lies_inside_what_the_crate_can_decode_and_encode() {
        for &(key, lo, hi) in TABLE {
            let crate_range = key.valid_versions();
            assert!(lo <= hi && lo >= crate_range.min && hi <= crate_range.max, "{key:?} {lo}-{hi} vs {crate_range}");
        }
    }
}
