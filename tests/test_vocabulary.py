"""The vocabularies `predict` compares string cells with, read from a canned Estimator's
export: tables filled from a list and from a vocabulary file (kept in the export's
assets/), as TensorFlow's own LinearClassifier exports them."""
import numpy as np
import pytest
import tensorflow as tf

from estimator_dist.serving import vocabulary

WORKCLASS = ["Private", "State-gov", "Federal-gov"]
EDUCATION = ["Bachelors", "HS-grad", "Masters", "Doctorate"]


@pytest.fixture(scope="module")
def canned_export(tmp_path_factory):
    """A LinearClassifier over a vocabulary-file column, a vocabulary-list column and a
    hashed one, trained 2 steps in this process and exported with the tf.Example receiver
    its feature columns give. The vocabulary file is written with counts, as vocabularies
    often are: categorical_column_with_vocabulary_file keys whole lines, so TensorFlow
    knows "Private\t100", not "Private"; its fourth line is past vocabulary_size."""
    base = tmp_path_factory.mktemp("vocabulary")
    vocab = base / "workclass.tsv"
    vocab.write_text("".join(f"{w}\t{100 - i}\n" for i, w in enumerate(WORKCLASS)) +
                     "Never-worked\t1\n")
    columns = [
        tf.feature_column.categorical_column_with_vocabulary_file(
            "workclass", str(vocab), vocabulary_size=len(WORKCLASS), num_oov_buckets=1),
        tf.feature_column.categorical_column_with_vocabulary_list("education", EDUCATION),
        tf.feature_column.categorical_column_with_hash_bucket("occupation", 10),
    ]

    def input_fn():
        features = {"workclass": [["Private"], ["State-gov"]],
                    "education": [["Masters"], ["HS-grad"]],
                    "occupation": [["Sales"], ["Tech"]]}
        return tf.data.Dataset.from_tensors((features, [[1], [0]])).repeat()

    estimator = tf.estimator.LinearClassifier(columns, model_dir=str(base / "run"))
    estimator.train(input_fn, max_steps=2)
    receiver = tf.estimator.export.build_parsing_serving_input_receiver_fn(
        tf.feature_column.make_parse_example_spec(columns))
    export = estimator.export_saved_model(str(base / "export"), receiver).decode()
    vocab.unlink()  # the export keeps its own copy in assets/
    return export


def test_a_vocabulary_file_column_and_a_list_column_are_both_known(canned_export):
    known = vocabulary.known_vocabularies(canned_export)
    # The file's whole lines, its first vocabulary_size of them; a hashed column has none.
    assert known == {"workclass": frozenset(f"{w}\t{100 - i}" for i, w in enumerate(WORKCLASS)),
                     "education": frozenset(EDUCATION)}
    cells = {"workclass": np.array([["Private"]], dtype=object),
             "education": np.array([["Masters"]], dtype=object)}
    (note,) = vocabulary.outside_notes(cells, known, "rows.csv")
    assert "feature 'workclass': 1 of 1 values are outside the vocabulary" in note, note


def test_a_value_outside_a_file_vocabulary_is_said(tmp_path):
    """A table that reads one delimited column of the file (TextFileInitializer key_index 0)
    knows that column's cells, not the whole lines."""
    vocab = tmp_path / "workclass.tsv"
    vocab.write_text("".join(f"{w}\t{i}\n" for i, w in enumerate(WORKCLASS)))
    export = tmp_path / "export"
    with tf.Graph().as_default():
        words = tf.compat.v1.placeholder(tf.string, [None], name="workclass")
        with tf.name_scope("workclass_lookup"):
            table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
                str(vocab), tf.string, 0, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER,
                delimiter="\t"), -1)
        ids = table.lookup(words)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.tables_initializer())
            builder = tf.compat.v1.saved_model.Builder(str(export))
            builder.add_meta_graph_and_variables(
                session, ["serve"], signature_def_map={
                    "serving_default": tf.compat.v1.saved_model.predict_signature_def(
                        {"workclass": words}, {"ids": ids})},
                main_op=tf.compat.v1.tables_initializer(), assets_collection=[
                    tf.compat.v1.get_default_graph().get_tensor_by_name(
                        "workclass_lookup/asset_path:0")])
            builder.save()
    vocab.unlink()  # the export reads its own copy in assets/
    known = vocabulary.known_vocabularies(str(export))
    assert known == {"workclass": frozenset(WORKCLASS)}
    cells = {"workclass": np.array([["Private"], ["Privat"], ["State-gov"]], dtype=object)}
    (note,) = vocabulary.outside_notes(cells, known, "rows.csv")
    assert note.startswith("--input rows.csv: feature 'workclass': 1 of 3 values are outside "
                           "the vocabulary the export knows (first 'Privat', example 2; "
                           "it knows 3"), note
