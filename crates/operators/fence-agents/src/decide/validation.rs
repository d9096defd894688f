//! Which nodes a template's credentials are checked for ahead of any failure (medik8s's
//! `statusValidationSample`), and what a status check's output means.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The sample: the first `n` of the sorted node names, `n` a count capped at the number of nodes
/// or a percentage rounded up. `Err` says why the value is unusable.
pub(crate) fn sample(nodes: &[String], size: Option<&IntOrString>) -> Result<Vec<String>, String> {
    let mut sorted = nodes.to_vec();
    sorted.sort();
    sorted.dedup();
    let n = match size {
        None => 0,
        Some(IntOrString::Int(i)) if *i >= 0 => (*i as usize).min(sorted.len()),
        Some(IntOrString::Int(i)) => return Err(format!("statusValidationSample {i} is negative")),
        Some(IntOrString::String(s)) => {
            let percent: usize = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .filter(|p| *p <= 100)
                .ok_or_else(|| {
                    format!("statusValidationSample {s:?} is neither a count nor a percentage like \"50%\"")
                })?;
            (percent * sorted.len()).div_ceil(100)
        }
    };
    sorted.truncate(n);
    Ok(sorted)
}

/// Whether the sample size asks for more nodes than the template names (worth a warning).
pub(crate) fn exceeds(nodes: usize, size: Option<&IntOrString>) -> bool {
    matches!(size, Some(IntOrString::Int(i)) if *i >= 0 && *i as usize > nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(n: usize) -> Vec<String> {
        (1..=n).rev().map(|i| format!("node-{i}")).collect()
    }

    #[test]
    fn counts_and_percentages() {
        assert_eq!(sample(&names(3), None).expect("valid sample"), Vec::<String>::new());
        assert_eq!(
            sample(&names(3), Some(&IntOrString::Int(2))).expect("valid sample"),
            ["node-1", "node-2"]
        );
        assert_eq!(
            sample(&names(3), Some(&IntOrString::Int(9)))
                .expect("valid sample")
                .len(),
            3
        );
        assert_eq!(
            sample(&names(3), Some(&IntOrString::String("34%".into())))
                .expect("valid sample")
                .len(),
            2
        );
        assert_eq!(
            sample(&names(3), Some(&IntOrString::String("0%".into())))
                .expect("valid sample")
                .len(),
            0
        );
        assert!(sample(&names(3), Some(&IntOrString::String("half".into()))).is_err());
        assert!(exceeds(3, Some(&IntOrString::Int(4))));
    }

    proptest! {
        #[test]
        fn never_more_than_the_nodes(n in 0usize..20, size in 0i32..40, pct in 0usize..=100) {
            prop_assert!(sample(&names(n), Some(&IntOrString::Int(size))).expect("valid sample").len() <= n);
            let by_pct = sample(&names(n), Some(&IntOrString::String(format!("{pct}%")))).expect("valid sample");
            prop_assert!(by_pct.len() <= n);
            prop_assert!(pct == 0 || n == 0 || !by_pct.is_empty());
        }
    }
}
