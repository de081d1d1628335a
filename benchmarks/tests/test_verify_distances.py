"""The verifier-alone diagnostic separates benign variants from hard negatives."""

from vlmcache_lab.fidelity_calibrate import train_images
from vlmcache_lab.verify_distances import distances, summary


def test_benign_variants_are_near_and_recolours_far():
    images, attrs, _ = train_images(6)
    found = distances(images, attrs)
    assert summary(found["benign:noise_s6"], 0.105)["pass_rate"] == 1.0
    assert max(found["benign:video_frame_1"]) < 0.05
    assert min(found["hard:recolour_permute"] + found["hard:mirror"]) > 0.2
