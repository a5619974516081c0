//! Host KVM capability probe (to be written).
