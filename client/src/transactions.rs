//! Transactional producing (Kafka's KIP-98 on Strata's protocol): the producer's transaction
//! state, and the requests to its transactional id's coordinator.
//!
//! A transactional producer takes its producer id and epoch from the coordinator of its
//! `transactional.id` (fencing every earlier producer of the id), then runs one transaction at
//! a time: `begin`, records sent as usual (each partition added to the transaction before its
//! first batch goes out), optionally a group's offsets (`send_offsets`), then `commit` or
//! `abort`, which waits for every batch and asks the coordinator to write the markers.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use strata_wire::protocol::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, Appended, EndTxnRequest, ErrorCode,
    InitProducerIdRequest, Request, Response, TopicPartitions, TransactionalInit,
    TxnOffsetCommitRequest, TxnProducer,
};

use crate::{Client, ClientError};

/// How long a request the coordinator answers CONCURRENT_TRANSACTIONS waits before trying
/// again (the coordinator is storing a change or writing markers).
const CONCURRENT_BACKOFF: Duration = Duration::from_millis(20);

/// A transactional producer's transaction, shared by its partition senders.
pub(crate) struct Transaction {
    pub(crate) id: String,
    timeout_ms: u32,
    state: Mutex<TxnProgress>,
    /// Held while partitions are added, so each is added once.
    adding: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct TxnProgress {
    /// (producer id, epoch) from `init_transactions`.
    identity: Option<(i64, i16)>,
    open: bool,
    added: HashSet<(Arc<str>, u32)>,
    /// The first batch of the open transaction that failed for good: it cannot commit.
    failed: Option<ClientError>,
}

fn txn_error(response: &Response) -> ErrorCode {
    match response {
        Response::AddPartitionsToTxn(answer)
        | Response::AddOffsetsToTxn(answer)
        | Response::EndTxn(answer)
        | Response::TxnOffsetCommit(answer) => answer.error,
        Response::InitProducerId(answer) => answer.error,
        _ => ErrorCode::InvalidRequest,
    }
}

fn not_ready(what: &str) -> ClientError {
    ClientError::InvalidArgument(format!("transactional producer: {what}"))
}

impl Transaction {
    pub(crate) fn new(id: String, timeout: Duration) -> Transaction {
        Transaction {
            id,
            timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
            state: Mutex::default(),
            adding: tokio::sync::Mutex::new(()),
        }
    }

    fn progress(&self) -> std::sync::MutexGuard<'_, TxnProgress> {
        self.state.lock().expect("transaction state")
    }

    fn producer(&self) -> Result<TxnProducer, ClientError> {
        let (producer_id, producer_epoch) = self
            .progress()
            .identity
            .ok_or_else(|| not_ready("init_transactions first"))?;
        Ok(TxnProducer {
            transactional_id: self.id.clone(),
            producer_id,
            producer_epoch,
        })
    }

    /// Sends `request` to the id's coordinator, again while it answers
    /// CONCURRENT_TRANSACTIONS, for up to the client's request timeout.
    async fn ask(&self, client: &Client, request: Request) -> Result<Response, ClientError> {
        let deadline = tokio::time::Instant::now() + client.config().request_timeout;
        loop {
            match client
                .coordinator_request(&self.id, true, request.clone(), txn_error)
                .await
            {
                Err(ClientError::Broker(ErrorCode::ConcurrentTransactions))
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(CONCURRENT_BACKOFF).await;
                }
                result => return result,
            }
        }
    }

    /// InitProducerId with the transactional id: the producer's id and epoch, every earlier
    /// producer of the id fenced (its open transaction aborted first).
    pub(crate) async fn init(&self, client: &Client) -> Result<(i64, i16), ClientError> {
        let request = Request::InitProducerId(InitProducerIdRequest {
            producer_id: -1,
            producer_epoch: -1,
            transactional: Appended(Some(TransactionalInit {
                transactional_id: self.id.clone(),
                timeout_ms: self.timeout_ms,
            })),
        });
        let Response::InitProducerId(answer) = self.ask(client, request).await? else {
            return Err(ClientError::Protocol(
                "InitProducerId answered otherwise".into(),
            ));
        };
        let identity = (answer.producer_id, answer.producer_epoch);
        *self.progress() = TxnProgress {
            identity: Some(identity),
            ..TxnProgress::default()
        };
        Ok(identity)
    }

    pub(crate) fn begin(&self) -> Result<(), ClientError> {
        let mut progress = self.progress();
        if progress.identity.is_none() {
            return Err(not_ready("init_transactions first"));
        }
        if progress.open {
            return Err(not_ready("a transaction is open already"));
        }
        progress.open = true;
        progress.added.clear();
        progress.failed = None;
        Ok(())
    }

    /// Whether records may be sent now (a transaction is open).
    pub(crate) fn check_open(&self) -> Result<(), ClientError> {
        if self.progress().open {
            Ok(())
        } else {
            Err(not_ready("begin a transaction before sending"))
        }
    }

    /// Adds the partition to the open transaction before its first batch goes out.
    pub(crate) async fn ensure_added(
        &self,
        client: &Client,
        topic: &Arc<str>,
        partition: u32,
    ) -> Result<(), ClientError> {
        let key = (topic.clone(), partition);
        if self.progress().added.contains(&key) {
            return Ok(());
        }
        let _adding = self.adding.lock().await;
        if self.progress().added.contains(&key) {
            return Ok(());
        }
        let request = Request::AddPartitionsToTxn(AddPartitionsToTxnRequest {
            producer: self.producer()?,
            topics: vec![TopicPartitions {
                topic: topic.to_string(),
                partitions: vec![partition],
            }],
        });
        self.ask(client, request).await?;
        self.progress().added.insert(key);
        Ok(())
    }

    /// A batch of the open transaction failed for good: the transaction can only abort.
    pub(crate) fn batch_failed(&self, error: &ClientError) {
        self.progress().failed.get_or_insert_with(|| error.clone());
    }

    /// AddOffsetsToTxn, then TxnOffsetCommit to the group's coordinator.
    pub(crate) async fn send_offsets(
        &self,
        client: &Client,
        group: &str,
        offsets: &[(String, u32, u64)],
    ) -> Result<(), ClientError> {
        self.check_open()?;
        let producer = self.producer()?;
        let add = Request::AddOffsetsToTxn(AddOffsetsToTxnRequest {
            producer: producer.clone(),
            group: group.to_string(),
        });
        self.ask(client, add).await?;
        let offsets = offsets
            .iter()
            .map(|(topic, partition, offset)| ((topic.clone(), *partition), *offset))
            .collect();
        let topics = crate::group::offset_topics(&offsets);
        let commit = Request::TxnOffsetCommit(TxnOffsetCommitRequest {
            producer,
            group: group.to_string(),
            member_id: String::new(),
            generation: -1,
            topics,
        });
        client.group_request(group, commit, txn_error).await?;
        Ok(())
    }

    /// EndTxn once every batch is answered (the caller flushed). A commit of a transaction
    /// with a failed batch is refused: abort it.
    pub(crate) async fn end(&self, client: &Client, commit: bool) -> Result<(), ClientError> {
        let failed = {
            let progress = self.progress();
            if !progress.open {
                return Err(not_ready("no transaction is open"));
            }
            progress.failed.clone()
        };
        let producer = self.producer()?;
        if commit && let Some(failed) = failed {
            return Err(ClientError::InvalidArgument(format!(
                "the transaction cannot commit, a batch failed ({failed}): abort it"
            )));
        }
        let request = Request::EndTxn(EndTxnRequest { producer, commit });
        self.ask(client, request).await?;
        let mut progress = self.progress();
        progress.open = false;
        progress.added.clear();
        progress.failed = None;
        Ok(())
    }
}

impl Client {
    /// Every transactional id the cluster's coordinators hold (each broker answers for those
    /// it coordinates), sorted by id.
    pub async fn list_transactions(
        &self,
    ) -> Result<Vec<strata_wire::protocol::ListedTransaction>, ClientError> {
        let metadata = self.refresh_metadata().await?;
        let mut listed = Vec::new();
        for broker in metadata.brokers.values() {
            let address = format!("{}:{}", broker.host, broker.port);
            let request =
                Request::ListTransactions(strata_wire::protocol::ListTransactionsRequest {
                    states: Vec::new(),
                    producer_ids: Vec::new(),
                    running_longer_than_ms: Default::default(),
                    id_pattern: Default::default(),
                });
            match self.request(&address, request).await? {
                Response::ListTransactions(answer) if answer.error == ErrorCode::None => {
                    listed.extend(answer.transactions);
                }
                Response::ListTransactions(answer) => {
                    return Err(ClientError::Broker(answer.error));
                }
                _ => {
                    return Err(ClientError::Protocol(
                        "ListTransactions answered otherwise".into(),
                    ));
                }
            }
        }
        listed.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        Ok(listed)
    }

    /// A transactional id as its coordinator holds it.
    pub async fn describe_transaction(
        &self,
        transactional_id: &str,
    ) -> Result<strata_wire::protocol::TransactionDescription, ClientError> {
        let request =
            Request::DescribeTransactions(strata_wire::protocol::DescribeTransactionsRequest {
                transactional_ids: vec![transactional_id.to_string()],
            });
        let answer = self
            .coordinator_request(transactional_id, true, request, |response| match response {
                Response::DescribeTransactions(answer) => answer
                    .transactions
                    .first()
                    .map_or(ErrorCode::InvalidRequest, |t| t.error),
                _ => ErrorCode::InvalidRequest,
            })
            .await?;
        match answer {
            Response::DescribeTransactions(mut answer) if !answer.transactions.is_empty() => {
                Ok(answer.transactions.remove(0))
            }
            _ => Err(ClientError::Protocol(
                "DescribeTransactions answered otherwise".into(),
            )),
        }
    }
}
