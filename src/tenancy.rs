//! Tenants (issue 49): the home of everything tenancy will need. For now
//! one namespace serves every request, and it is upstream's default tenant,
//! so the identity routes can already name it.

/// The tenant of a request that names none (upstream's `DEFAULT_TENANT`).
pub const DEFAULT_TENANT: &str = "00000000-0000-0000-0000-000000000001";
