//! One page of a listing sorted by key, as `GET /v1/locks?limit=&after=`
//! and `fencelock list --limit --after` answer it (`docs/http.md`).

/// The page of `items` that follows the key `after`: the items whose key
/// sorts after it, at most `limit` of them, and the cursor of the next page
/// (the page's last key, `None` when nothing follows). `items` must be
/// sorted by `key`.
///
/// A page never ends between two items of one key (a read-write lock's
/// readers are one lease each): the cursor names a key, so the next page
/// would skip the rest of them. It holds more than `limit` items only to
/// finish its last key. `limit` 0 counts as 1.
///
/// ```
/// use fencelock_core::page_by_key;
///
/// let leases = vec!["a", "r", "r", "r", "z"];
/// let (page, next) = page_by_key(leases.clone(), |k| k, None, 2);
/// assert_eq!((page, next.as_deref()), (vec!["a", "r", "r", "r"], Some("r")));
/// let (page, next) = page_by_key(leases, |k| k, Some("r"), 2);
/// assert_eq!((page, next), (vec!["z"], None));
/// ```
pub fn page_by_key<T>(
    items: Vec<T>,
    key: impl Fn(&T) -> &str,
    after: Option<&str>,
    limit: usize,
) -> (Vec<T>, Option<String>) {
    let mut rest: Vec<T> = items
        .into_iter()
        .filter(|i| after.is_none_or(|a| key(i) > a))
        .collect();
    let mut end = limit.max(1).min(rest.len());
    while end < rest.len() && key(&rest[end]) == key(&rest[end - 1]) {
        end += 1;
    }
    let next = (end < rest.len()).then(|| key(&rest[end - 1]).to_owned());
    rest.truncate(end);
    (rest, next)
}
