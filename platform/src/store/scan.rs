//! A newest-first listing read one index page at a time: up to `limit` entries a filter keeps,
//! looking at no more than `budget` index entries, with the cursor that continues it.

use std::future::Future;

use fleet_protocol::dead_letters::ListCursor;

use super::StoreError;

/// One index page as read: each entry's cursor and, when the listing's filter keeps it, its value.
pub(crate) type ScanPage<T> = Vec<(ListCursor, Option<T>)>;

/// Reads pages of at most `page` entries after `cursor` (`read(cursor, n)`) until `limit` values
/// are kept, `budget` entries were looked at, or the index ends. The cursor returned continues the
/// listing (also when the budget ran out first); `None` means the end.
pub(crate) async fn newest_first<T, F, Fut>(
    mut cursor: Option<ListCursor>,
    limit: usize,
    budget: usize,
    page: usize,
    mut read: F,
) -> Result<(Vec<T>, Option<ListCursor>), StoreError>
where
    F: FnMut(Option<ListCursor>, usize) -> Fut,
    Fut: Future<Output = Result<ScanPage<T>, StoreError>>,
{
    let mut found = Vec::new();
    let mut scanned = 0;
    while scanned < budget {
        let want = page.min(budget - scanned);
        let entries = read(cursor.clone(), want).await?;
        let exhausted = entries.len() < want;
        for (at, kept) in entries {
            scanned += 1;
            cursor = Some(at);
            if let Some(value) = kept {
                found.push(value);
                if found.len() == limit {
                    return Ok((found, cursor));
                }
            }
        }
        if exhausted {
            return Ok((found, None));
        }
    }
    Ok((found, cursor))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An index of `n` entries, newest first (ids `e{n-1}` … `e0`), keeping the even ones.
    async fn list(n: i64, after: Option<ListCursor>, limit: usize, budget: usize) -> (Vec<i64>, Option<ListCursor>) {
        let read = |cursor: Option<ListCursor>, want: usize| async move {
            let start = cursor.map_or(n - 1, |c| c.at_ms - 1);
            let page: ScanPage<i64> = (0..=start)
                .rev()
                .take(want)
                .map(|i| (ListCursor { at_ms: i, id: format!("e{i}") }, (i % 2 == 0).then_some(i)))
                .collect();
            Ok(page)
        };
        newest_first(after, limit, budget, 3, read).await.unwrap()
    }

    #[tokio::test]
    async fn a_page_stops_at_its_limit_its_budget_or_the_end() {
        let (found, next) = list(10, None, 2, 100).await;
        assert_eq!(found, vec![8, 6]);
        assert_eq!(next.as_ref().map(|c| c.at_ms), Some(6), "full: the cursor is the last one kept");
        let (found, next) = list(10, next, 100, 100).await;
        assert_eq!((found, next), (vec![4, 2, 0], None), "the index ended");
        let (found, next) = list(10, None, 100, 4).await;
        assert_eq!(found, vec![8, 6]);
        assert_eq!(next.map(|c| c.at_ms), Some(6), "the budget ran out after 4 entries: short, with a cursor");
    }
}
