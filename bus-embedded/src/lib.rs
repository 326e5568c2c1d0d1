//! Placeholder: filled by its backend issue.
